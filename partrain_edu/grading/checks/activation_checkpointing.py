"""Exercise 10, activation checkpointing (激活重计算) under a memory budget, on 1 rank.

Per run (trials.py) the check draws a stack of 5–7 MLP blocks Linear(d_i, w_i) → GELU or ReLU → Linear(w_i, d_i+1)
— the rows, every width d_i and hidden width w_i, the activations and the weights — and four budgets, graded in a
drawn order: a tight one (at which taking blocks greedily, by bytes saved or by bytes saved per FLOP, misses the
cheapest plan), one exactly at the bytes of a plan that is cheaper than every plan holding less (≤ is right, < is
not), one in between and a loose one (the plain forward fits). The learner's
`forward_under_budget(blocks, x, budget_bytes)` runs inside `SavedBytes` (givens): the bytes autograd saves for
backward and still holds when the forward returns, each storage once, parameters left out. Forward pre-hooks count
each block's calls during the backward: the recomputations. Graded per budget, in the order the quantities arise:
x and the blocks' parameters unchanged; the output and every gradient equal the plain model's; saved bytes ≤
budget (a failure says by how much); the recompute cost Σ (recomputations of block i)·FLOPs_i is the least of
every plan that fits (a failure says by how much it is more, never which plan is cheapest: a fresh run's blocks
and budgets are others). A plan splits the chain into segments, run plainly (4·rows·(d + 2w) bytes per GELU
block, whose input and output are both saved; 4·rows·(d + w) per ReLU block, whose output is also the next
Linear's saved input) or under one checkpoint (holding only its first block's input, 4·rows·d). The budgets are
drawn with these formulas (activation_plans.py); the grading measures: the trusted half runs every plan with
SavedBytes — each of the 2^n choices of blocks to recompute, consecutive ones under one checkpoint and one
checkpoint each. Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; Korthikanti et al. 2022
(recompute selectively).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from partrain_edu.grading.checks.activation_plans import Stack, budgets_for, greedy, plan_of, recomputed_by
from partrain_edu.grading.compare import differ
from partrain_edu.grading.givens.activation_checkpointing import SavedBytes, forward_flops
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import Problem, register
from partrain_edu.grading.trials import stream

INPUTS, OUTPUT, GRADS, CALLS, BYTES, COST = range(6)   # when in a budget's run a problem arises


@dataclass(frozen=True)
class Run:
    stack: Stack
    budgets: tuple[int, ...]   # in the order they are graded
    weights: int               # seeds the blocks' parameters, x and the loss weights


def run_of(seed: int) -> Run:
    """The run's stack of blocks and its four budgets (activation_plans.budgets_for), from `seed` alone."""
    rng = stream(seed, "activation_checkpointing")
    while True:  # almost every stack has a budget at which greedy orders miss; redraw the rare one without
        n, rows = rng.randint(5, 7), rng.randint(2, 5)
        stack = Stack(rows, tuple(rng.randint(2, 8) for _ in range(n + 1)), tuple(rng.randint(4, 32) for _ in range(n)),
                      tuple(rng.choice(("gelu", "relu")) for _ in range(n)))
        budgets = budgets_for(stack, rng)
        if budgets:
            return Run(stack, budgets, rng.randrange(2**31))


def build(run: Run) -> tuple[nn.ModuleList, torch.Tensor, torch.Tensor]:
    """The blocks, the input x (rows, d_0) and the loss weights (rows, d_n): the same on the rank and here."""
    s = run.stack
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(run.weights)
        blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(s.widths[i], s.hidden[i]), nn.GELU() if act == "gelu" else nn.ReLU(),
                          nn.Linear(s.hidden[i], s.widths[i + 1]))
            for i, act in enumerate(s.activations))
        return blocks, torch.randn(s.rows, s.widths[0]), torch.randn(s.rows, s.widths[-1])


def gradients(x: torch.Tensor, blocks: nn.ModuleList) -> list[tuple[str, torch.Tensor | None]]:
    """(name, gradient) of the input and of every parameter, in the order the observe half reports them."""
    named = [("dL/dx", x.grad)]
    for name, p in blocks.named_parameters():  # "2.0.weight": block 2, layer 0 (the first Linear), weight
        block, layer, kind = name.split(".")
        named.append((f"dL/d(block {block}'s {'first' if layer == '0' else 'second'} Linear {kind})", p.grad))
    return named


def listed(blocks: list[int]) -> str:
    """'blocks 0, 2, 4', 'block 3' or 'no block'."""
    return f"block{'s' * (len(blocks) > 1)} " + ", ".join(map(str, blocks)) if blocks else "no block"


def _count(module: nn.Module, args: tuple, now: list, i: int) -> None:
    now[0][i] += 1


def observe(ctx, forward_under_budget, *, seed: int) -> list[dict]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny blocks: on a busy machine, more threads only wait on each other
    try:
        run = run_of(seed)
        return [_observe_one(forward_under_budget, run, budget) for budget in run.budgets]
    finally:
        torch.set_num_threads(threads)


def _observe_one(forward_under_budget, run: Run, budget: int) -> dict:
    """One call of the learner's function at `budget`: what it changed, its output, the bytes its graph holds,
    each block's calls in forward and in backward, and the gradients."""
    blocks, x, w = build(run)  # fresh for each budget: nothing the learner did to the last one stays
    before = {name: p.detach().clone() for name, p in blocks.named_parameters()}
    x.requires_grad_()
    calls = {"forward": [0] * len(blocks), "backward": [0] * len(blocks)}
    now = [calls["forward"]]  # the tally the hooks add to: the forward's, then the backward's
    for i, block in enumerate(blocks):  # a pre-hook: early-stopped recomputation never reaches a post-hook
        block.register_forward_pre_hook(functools.partial(_count, now=now, i=i))
    with SavedBytes(blocks) as saved:
        y = forward_under_budget(blocks, x, budget)
    held = saved.bytes  # while y lives: what its graph keeps for backward
    changed = [[name] for name, p in blocks.named_parameters() if not torch.equal(p.detach(), before[name])]
    blocks.zero_grad(set_to_none=True)  # a trial backward inside the learner's forward must not add up
    x.grad = None
    now[0] = calls["backward"]
    if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == w.shape:
        (y * w).sum().backward()
    return {"x": tensor(x.detach()), "changed": changed, "out": tensor(y), "saved_bytes": held,
            "forward_calls": calls["forward"], "recomputed": calls["backward"],
            "grads": [tensor(g) for _, g in gradients(x, blocks)]}


# --- the trusted half: every plan measured, the cheapest that fits ---------------------------------------

def run_plan(blocks: nn.ModuleList, x: torch.Tensor, plan) -> torch.Tensor:
    for start, end, checkpointed in plan:
        segment = nn.Sequential(*blocks[start:end])
        x = checkpoint(segment, x, use_reentrant=False) if checkpointed else segment(x)
    return x


@functools.lru_cache(maxsize=4)
def measured(run: Run) -> dict:
    """The plain model's output and gradients, each block's forward FLOPs, and {plan: bytes held} measured with
    SavedBytes for every choice of blocks to recompute, consecutive ones under one checkpoint and one by one."""
    blocks, x, w = build(run)
    x.requires_grad_()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a few hundred forwards of tiny blocks: on a busy machine, threads only wait
    try:
        with torch.enable_grad():  # the learner's kernel may have turned autograd off
            y = nn.Sequential(*blocks)(x)
            (y * w).sum().backward()
            flops, h = [], x.detach()
            for block in blocks:
                flops.append(forward_flops(block, h))
                h = block(h).detach()
            held = {}
            for plan in run.stack.plans():
                with SavedBytes(blocks) as saved:
                    out = run_plan(blocks, x, plan)
                held[plan] = saved.bytes
                del out
    finally:
        torch.set_num_threads(threads)
    return {"x": x.detach(), "out": y.detach(), "grads": gradients(x, blocks), "flops": flops, "held": held}


def cost_of(flops: list[int], chosen) -> int:
    return sum(flops[i] for i in chosen)


def judge(run: Run, budget: int, seen: Reader) -> tuple[int, str] | None:
    """(when, problem): the first problem of the run at `budget`, in the order the quantities arise."""
    ref = measured(run)
    n = len(run.stack.hidden)
    where = f"budget {budget} B"
    got_x = seen["x"].tensor()
    changed = [name for (name,) in seen["changed"].records(("name",), most=64, what="parameter names")]
    if differ("", ref["x"], got_x) is not None or changed:
        what = "x" if differ("", ref["x"], got_x) is not None else f"the parameter {changed[0]} of the blocks"
        return INPUTS, (f"{where}: your function changed {what} — it runs the blocks on x, it must not edit either "
                        "(no .data, in-place ops or optimizer steps on them)")
    problem = differ(f"{where}, output", ref["out"], seen["out"].tensor())
    if problem:
        return OUTPUT, (problem + ". Hint: run every block once, in order; checkpoint(block, x, use_reentrant=False) "
                        "returns what block(x) does")
    for (what, want), got in zip(ref["grads"], seen["grads"].items(len(ref["grads"])), strict=True):
        problem = differ(f"{where}, {what}", want, got.tensor())
        if problem:
            return GRADS, (problem + ". Hint: the graph must stay connected — no x.detach(), torch.no_grad() or "
                           ".data on the way; checkpoint keeps it connected and recomputes in backward")
    forward_calls = [c.count() for c in seen["forward_calls"].items(n)]
    recomputed = [c.count() for c in seen["recomputed"].items(n)]
    if 0 in forward_calls:
        return CALLS, (f"{where}: block {forward_calls.index(0)} never ran as block(x) (forward calls per block "
                       f"{forward_calls}): call the module itself (or checkpoint(block, x)), not block.forward(x) — "
                       "the check counts calls with forward pre-hooks")
    flops, held = ref["flops"], ref["held"]
    got, cost = seen["saved_bytes"].count(), sum(k * f for k, f in zip(recomputed, flops, strict=True))
    mine = [i for i, k in enumerate(recomputed) if k]
    if got > budget:
        return BYTES, (f"{where}: autograd held {got} B of saved activations for backward, {got - budget} B over the "
                       f"budget (you recomputed {listed(mine)}). Hint: a checkpointed block holds only its input, "
                       "consecutive blocks under one checkpoint only the first one's; measure each block with "
                       "SavedBytes, reading .bytes while its output lives")
    floor = held[plan_of(frozenset(mine), merged=True, n=n)]
    if got < floor:
        return BYTES, (f"{where}: autograd held {got} B, less than any plan recomputing {listed(mine)} can "
                       f"({floor} B): saved tensors went past the check's saved_tensors_hooks (your own hooks "
                       "around the forward?) or a block was recomputed without its hooks (block.forward)")
    fits = {plan: cost_of(flops, recomputed_by(plan)) for plan, b in held.items() if b <= budget}
    least = min(fits.values())
    if cost != least:
        return COST, (f"{where}: you recomputed {listed(mine)} in backward ({cost} FLOPs) holding {got} B; the "
                      f"plans that fit recompute no less than {least} FLOPs: yours is {cost - least} FLOPs more. "
                      f"Hint: {cost_hint(run, budget, mine, cost, fits)}")
    return None


def cost_hint(run: Run, budget: int, mine: list[int], cost: int, fits: dict) -> str:
    """Why the learner's plan recomputes too much, where its own choice shows it (never the cheapest plan)."""
    flops, held = measured(run)["flops"], measured(run)["held"]
    apart = [cost_of(flops, recomputed_by(p)) for p in fits if all(e - s == 1 for s, e, ckpt in p if ckpt)]
    below = [cost_of(flops, recomputed_by(p)) for p, b in held.items() if b < budget]
    if len(mine) == len(run.stack.hidden):
        return "checkpointing every block always fits, but recomputes the whole forward"
    if min(fits.values()) == 0:
        return f"the plain forward fits ({held[plan_of(frozenset(), False, n=len(flops))]} B ≤ {budget} B)"
    strict = bool(below) and cost == min(below)
    greedy_by = next((order for order in ("bytes saved", "bytes saved per FLOP")
                      if set(mine) == greedy(run.stack, budget, order)), None)
    if strict and greedy_by:  # two mistakes give this plan: name both, not one at random
        return (f"that is both the cheapest plan holding less than {budget} B and what taking blocks by most "
                f"{greedy_by} first gives: compare with bytes ≤ budget (not <), and compare every subset of the "
                "blocks (a greedy order can miss the optimum of this 0/1 knapsack)")
    if strict:
        return (f"that is the cheapest plan holding less than {budget} B; a plan holding exactly the budget fits "
                "too (bytes ≤ budget)")
    if greedy_by:
        return (f"that is what taking blocks by most {greedy_by} first gives, and a greedy order can miss the "
                "optimum: minimise Σ FLOPs of the recomputed blocks subject to bytes ≤ budget, a 0/1 knapsack "
                "— compare every subset of the blocks")
    if apart and cost == min(apart):
        return ("that is the cheapest plan with one checkpoint per block; consecutive blocks under one "
                "checkpoint hold only the first one's input, and such a plan fits for fewer FLOPs here")
    return "minimise Σ FLOPs of the recomputed blocks subject to bytes held ≤ budget, over every subset of blocks"


@register("activation_checkpointing", nproc=1, observe=observe,
          given={"SavedBytes": SavedBytes, "forward_flops": forward_flops, "checkpoint": checkpoint},
          summary="for stacks of 5–7 blocks and four budgets drawn per run (tight, exactly at a plan's bytes, in "
          "between, loose) the output and every gradient equal the plain model's, x and the blocks are left "
          "unchanged, the saved activations fit each budget, and the FLOPs recomputed in backward are the least of "
          "every plan that fits (Chen et al. 2016)")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    run = run_of(seed)
    for b, (budget, seen) in enumerate(zip(run.budgets, observed.items(len(run.budgets)), strict=True)):
        found = judge(run, budget, seen)
        if found:
            return [Problem(found[1], at=(b, found[0]))]
    return []
