"""Exercise 10, activation checkpointing (激活重计算) under a memory budget, on 1 rank.

The learner's `forward_under_budget(blocks, x, budget_bytes)` runs six MLP blocks Linear(d_i, w_i) → GELU or
ReLU → Linear(w_i, d_i+1) of different widths, for three budgets, inside `SavedBytes` (givens): the bytes autograd
saves for backward and still holds when the forward returns, each storage once, parameters left out. Forward
pre-hooks count each block's calls during the backward: the recomputations. Graded: the output and every
gradient equal the plain model's; saved bytes ≤ budget; the recompute cost Σ (recomputations of block i)·FLOPs_i
is the least of every plan that fits. A plan splits the chain into segments, run plainly (holding 4·rows·(d + 2w)
bytes per GELU block, whose input and output are both saved; 4·rows·(d + w) per ReLU block, whose output is also
the next Linear's saved input) or under one checkpoint (holding only its input, 4·rows·d; its blocks run again in
backward). The trusted half measures, for each of the 2^6 choices of blocks to recompute, the plan holding least
(consecutive ones under one checkpoint) and the one checkpointing them one by one, and takes the cheapest that
fits: a 0/1 knapsack, where taking the block that saves most bytes (or most bytes per FLOP) first can miss it.
Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; Korthikanti et al. 2022 (recompute selectively).
"""
from __future__ import annotations

import functools
import itertools

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

from partrain_edu.grading.checks.tensor_parallel import loss_weights   # L = Σ Y·w, as in exercise 05
from partrain_edu.grading.compare import differ
from partrain_edu.grading.givens.activation_checkpointing import SavedBytes, forward_flops
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import register

ROWS = 4                                   # a batch of 4 rows; float32, so an activation of width d is 16·d bytes
WIDTHS = (4, 4, 8, 4, 16, 4, 8)            # d_0 .. d_6: block i maps d_i → d_i+1
HIDDEN = (8, 48, 16, 24, 32, 16)           # w_i: block i's hidden width
ACTIVATIONS = ("gelu", "relu", "gelu", "gelu", "gelu", "relu")
# Tight (a greedy order misses the cheapest plan), medium (two blocks suffice), loose (the plain forward fits).
BUDGETS = (2450, 3000, 4500)


def blocks_and_input() -> tuple[nn.ModuleList, torch.Tensor]:
    """The six blocks and the input x (ROWS, d_0), the same from the same seed on the rank and in the caller."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(10)
        blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTHS[i], HIDDEN[i]), nn.GELU() if act == "gelu" else nn.ReLU(),
                          nn.Linear(HIDDEN[i], WIDTHS[i + 1]))
            for i, act in enumerate(ACTIVATIONS))
        return blocks, torch.randn(ROWS, WIDTHS[0])


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
    runs = []
    for budget in BUDGETS:
        blocks, x = blocks_and_input()  # fresh for each budget: nothing the learner did to the last one stays
        x.requires_grad_()
        calls = {"forward": [0] * len(blocks), "backward": [0] * len(blocks)}
        now = [calls["forward"]]  # the tally the hooks add to: the forward's, then the backward's
        for i, block in enumerate(blocks):  # a pre-hook: early-stopped recomputation never reaches a post-hook
            block.register_forward_pre_hook(functools.partial(_count, now=now, i=i))
        with SavedBytes(blocks) as saved:
            y = forward_under_budget(blocks, x, budget)
        held = saved.bytes  # while y lives: what its graph keeps for backward
        blocks.zero_grad(set_to_none=True)  # a trial backward inside the learner's forward must not add up
        x.grad = None
        now[0] = calls["backward"]
        if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == (ROWS, WIDTHS[-1]):
            (y * loss_weights(y)).sum().backward()
        runs.append({"out": tensor(y), "saved_bytes": held, "forward_calls": calls["forward"],
                     "recomputed": calls["backward"], "grads": [tensor(g) for _, g in gradients(x, blocks)]})
    return runs


# --- the trusted half: every plan measured, the cheapest that fits ---------------------------------------

def plan_of(chosen: frozenset[int], merged: bool, n: int = len(HIDDEN)) -> tuple[tuple[int, int, bool], ...]:
    """The plan recomputing blocks `chosen`: segments (start, end, checkpointed), with consecutive chosen blocks
    under one checkpoint (`merged`: it holds only the first one's input, the least any plan with this choice
    can hold) or one checkpoint each. Plain blocks form one segment: they hold the same either way."""
    segments: list[list] = []
    for i in range(n):
        ckpt = i in chosen
        if segments and segments[-1][2] == ckpt and (merged or not ckpt):
            segments[-1][1] = i + 1
        else:
            segments.append([i, i + 1, ckpt])
    return tuple(map(tuple, segments))


def run_plan(blocks: nn.ModuleList, x: torch.Tensor, plan) -> torch.Tensor:
    for start, end, checkpointed in plan:
        segment = nn.Sequential(*blocks[start:end])
        x = checkpoint(segment, x, use_reentrant=False) if checkpointed else segment(x)
    return x


def recomputed_by(plan) -> frozenset[int]:
    return frozenset(i for start, end, ckpt in plan if ckpt for i in range(start, end))


def describe(plan) -> str:
    """'checkpoint blocks 0, 2, 4' (a segment of several blocks as '2–3 as one checkpoint')."""
    parts = [str(s) if e - s == 1 else f"{s}–{e - 1} as one checkpoint" for s, e, ckpt in plan if ckpt]
    return "checkpoint blocks " + ", ".join(parts) if parts else "checkpoint nothing"


@functools.lru_cache(maxsize=1)
def measured() -> tuple[list[int], dict]:
    """FLOPs of each block's forward, and {plan: bytes held} measured with SavedBytes for each of the 2^6 choices
    of blocks to recompute, merged and one by one."""
    blocks, x = blocks_and_input()
    x.requires_grad_()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a hundred forwards of tiny blocks: on a busy machine, threads only wait on each other
    try:
        flops, h = [], x.detach()
        for block in blocks:
            flops.append(forward_flops(block, h))
            h = block(h).detach()
        held = {}
        choices = [frozenset(c) for k in range(len(blocks) + 1) for c in itertools.combinations(range(len(blocks)), k)]
        with torch.enable_grad():  # the learner's kernel may have turned autograd off
            for plan in {plan_of(chosen, merged) for chosen in choices for merged in (False, True)}:
                with SavedBytes(blocks) as saved:
                    y = run_plan(blocks, x, plan)
                held[plan] = saved.bytes
                del y
    finally:
        torch.set_num_threads(threads)
    return flops, held


def cheapest(budget: int) -> tuple[int, tuple]:
    """(FLOPs, plan): the least recomputation among the plans whose bytes fit; on a tie (the same blocks,
    checkpointed apart or together) the one with the most segments, blocks checkpointed one by one."""
    flops, held = measured()
    return min((sum(flops[i] for i in recomputed_by(plan)), -len(plan), plan)
               for plan, b in held.items() if b <= budget)[::2]


@register("activation_checkpointing", nproc=1, observe=observe,
          given={"SavedBytes": SavedBytes, "forward_flops": forward_flops, "checkpoint": checkpoint},
          summary="for budgets of 2450, 3000 and 4500 bytes the output and "
          "every gradient equal the plain model's, the saved activations fit each budget, and the FLOPs "
          "recomputed in backward are the least of every plan that fits (Chen et al. 2016)")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    blocks, x = blocks_and_input()
    x.requires_grad_()
    with torch.enable_grad():
        y_plain = nn.Sequential(*blocks)(x)
        (y_plain * loss_weights(y_plain)).sum().backward()
    flops, held = measured()
    plain_bytes = held[((0, len(blocks), False),)]
    for budget, run in zip(BUDGETS, observed.items(len(BUDGETS))):
        where = f"budget {budget} B"
        problem = differ(f"{where}, output", y_plain.detach(), run["out"].tensor())
        if problem:
            return [problem + ". Hint: run every block once, in order; checkpoint(block, x, use_reentrant=False) "
                    "returns what block(x) does"]
        expected = gradients(x, blocks)
        for (what, want), got in zip(expected, run["grads"].items(len(expected))):
            problem = differ(f"{where}, {what}", want, got.tensor())
            if problem:
                return [problem + ". Hint: the graph must stay connected — no x.detach(), torch.no_grad() or "
                        ".data on the way; checkpoint keeps it connected and recomputes in backward"]
        forward_calls = [c.count() for c in run["forward_calls"].items(len(blocks))]
        recomputed = [c.count() for c in run["recomputed"].items(len(blocks))]
        if 0 in forward_calls:
            return [f"{where}: block {forward_calls.index(0)} never ran as block(x) (forward calls per block "
                    f"{forward_calls}): call the module itself (or checkpoint(block, x)), not block.forward(x) — "
                    "the check counts calls with forward pre-hooks"]
        got, cost = run["saved_bytes"].count(), sum(k * f for k, f in zip(recomputed, flops))
        mine = [i for i, k in enumerate(recomputed) if k]
        best_cost, best = cheapest(budget)
        fix = f"the cheapest plan that fits is to {describe(best)} ({held[best]} B, recomputing {best_cost} FLOPs)"
        if got > budget:
            return [f"{where}: autograd held {got} B of saved activations for backward, {got - budget} B over the "
                    f"budget (you recomputed {listed(mine)}); {fix}. Hint: a checkpointed block holds "
                    f"only its input; measure each block with SavedBytes (plain: {plain_bytes} B in all)"]
        floor = held[plan_of(frozenset(mine), merged=True)]
        if got < floor:
            return [f"{where}: autograd held {got} B, less than any plan recomputing {listed(mine)} can "
                    f"({floor} B): saved tensors went past the check's saved_tensors_hooks (your own hooks "
                    "around the forward?) or a block was recomputed without its hooks (block.forward)"]
        if cost != best_cost:
            if len(mine) == len(blocks):
                hint = "checkpointing every block always fits, but recomputes the whole forward"
            elif best_cost == 0:
                hint = f"the plain forward already fits ({plain_bytes} B ≤ {budget} B): recompute nothing"
            else:
                hint = ("taking blocks in a greedy order (most bytes first, or most bytes per FLOP) can miss the "
                        "optimum: minimise Σ FLOPs of the checkpointed blocks subject to bytes ≤ budget, a 0/1 "
                        "knapsack — try every subset of the six blocks")
            return [f"{where}: you recomputed {listed(mine)} in backward ({cost} FLOPs) holding {got} B; {fix}. "
                    f"Hint: {hint}"]
    return []
