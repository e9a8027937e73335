"""Exercise 12, ring attention (context parallelism, 上下文并行; Liu et al. 2023, "Ring Attention with Blockwise
Transformers"): the sequence is cut into n blocks, member g of the group holds rows [g·R, (g+1)·R) of Q, K and V,
and the K/V blocks travel around the ring while each rank merges the blocks' partial softmaxes with a running max
and log-sum-exp (the online softmax of Milakov & Gimelshein 2018, as in FlashAttention, Dao et al. 2022).

Graded on 4 ranks, in four configurations drawn per run (ring_attention_reference.py): the default group of 4
(group=None) and the group of global ranks [1, 2, 3] (rank 0, outside it, idles: a ring of 3, whose group ranks
are not the global ones), each non-causal and causal; per configuration the heads, the positions per rank R, the
head dim and the data (Q scaled up, so the blocks' softmax masses differ a lot) are drawn. Per rank, in the order
the problems arise: a call that raised (kept, so that an earlier configuration's problem is still told first);
the output equals full softmax attention, recomputed here in float64; q, k, v are left as they came; the forward's
traffic is a ring's — point-to-point to the group's ring neighbours only,
    bytes sent per rank = (n−1)·(bytes of its K block + V block) = (n−1)/n · (bytes of the whole K and V);
every pass_to_next's result reaches the output (else its backward, which carries the gradient home, would run on
some ranks only: the check says so instead of hanging); dQ, dK, dV under the loss Σ out·w (w drawn); the same
bytes of dK, dV back. A wrong output is matched against the likely mistakes (blocks averaged, no rescaling, own
block only, the causal mask built for the wrong block owner or position, the world's rank or size instead of
the group's) and a wrong dK or dV against the gradient of this rank's own queries only.
"""
from __future__ import annotations

import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from partrain_edu.comm import CommTracer
from partrain_edu.grading.checks.ring_attention_reference import (
    SUBGROUP,
    WORLD,
    Config,
    configs,
    mistakes,
    reference,
    ring_output,
    tensors,
)
from partrain_edu.grading.compare import differ
from partrain_edu.grading.givens.ring_attention import pass_to_next, watching
from partrain_edu.grading.observations import Malformed, Reader, tensor, traffic
from partrain_edu.grading.registry import Problem, register

P2P = {"isend", "irecv", "send", "recv"}
TOL = {"rtol": 1e-4, "atol": 1e-5}        # float32 ring vs float64 reference: the solution stays far under it
PATIENCE_S = 15                           # how long a rank whose call raised waits for the others to say so too
OUTPUT, INPUTS, FORWARD, PASSES, GRADS, BACKWARD = range(6)   # when in a configuration a problem arises


def _agree(ok: bool, error: Exception | None = None) -> bool:
    """Whether every rank is ok (a vote over all ranks, outside the traced region): backward runs on all or none.
    A rank whose call raised `error` waits a while only: when the other ranks are stuck waiting for its messages,
    the error is raised after all, and the launch fails with it as it would have at once."""
    vote = torch.tensor([0 if ok else 1])
    work = dist.all_reduce(vote, async_op=True)
    if error is None:
        work.wait()
    else:
        try:
            work.wait(timeout=timedelta(seconds=PATIENCE_S))
        except RuntimeError:
            raise error from None
    return int(vote) == 0


def _raised(error: Exception, when: str) -> dict:
    """What a learner's error was, and where in their function: the check words it with the other problems."""
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith("<your ")]
    return {"error": f"{type(error).__name__}: {str(error)[:300]}", "when": when, "lines": lines[-3:]}


def reached_calls(out: torch.Tensor) -> set[int]:
    """The indices (`ring_call`, noted by the given while watching) of the passes whose results `out` depends on."""
    found = set()
    seen = {}
    todo = [out.grad_fn]
    while todo and len(seen) < 100_000:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node  # kept alive while walking: no id is reused
        if isinstance(getattr(node, "ring_call", None), int):
            found.add(node.ring_call)
        todo.extend(f for f, _ in node.next_functions)
    return found


def observe(ctx, ring_attention, *, seed: int) -> list[dict]:
    groups = {tuple(range(WORLD)): None, SUBGROUP: dist.new_group(list(SUBGROUP))}  # every rank makes it
    runs = []
    for cfg in configs(seed):
        if ctx.rank not in cfg.members:  # joins the votes of the members (one, and one more after backward)
            if _agree(True):
                _agree(True)
            runs.append({})
            continue
        mine = cfg.block(cfg.members.index(ctx.rank))
        q, k, v, w = (t[:, mine].clone() for t in tensors(cfg))
        for t in (q, k, v):
            t.requires_grad_()
        error = None  # a learner's error, kept so that an earlier configuration's problem can still be told
        try:
            with watching(groups[cfg.members]) as calls, CommTracer() as forward:
                out = ring_attention(q, k, v, group=groups[cfg.members], causal=cfg.causal)
        except NotImplementedError:
            raise
        except Exception as err:
            out, error = None, err
        usable = isinstance(out, torch.Tensor) and out.requires_grad and out.shape == q.shape
        unused = sorted(set(range(len(calls))) - reached_calls(out)) if usable else []
        go = _agree(usable and not unused, error)  # else a rank would wait forever for a gradient never sent
        run = {"out": tensor(out), "inputs": [tensor(t) for t in (q, k, v)], "passes": len(calls),
               "unused": unused, "backward_ran": go, "raised": error and _raised(error, "forward")}
        with CommTracer() as backward:
            if go:
                try:
                    (out * w).sum().backward()
                except Exception as err:
                    error = err
                    run["raised"] = _raised(err, "backward")
        if go:
            _agree(error is None, error)
        runs.append({**run, "grads": [tensor(t.grad) for t in (q, k, v)], "forward": traffic(forward),
                     "backward": traffic(backward)})
    return runs


# --- the trusted half: everything recomputed here, in float64 -------------------------------------------------

def output_hint(cfg: Config, g: int, rank: int, got) -> str:
    """Where the wrong output first differs, and the mistake it is, when it is one of the likely ones."""
    rows = cfg.rows
    if not isinstance(got, torch.Tensor) or got.shape != (cfg.heads, rows, cfg.dim):
        return f". Return a tensor shaped like q: ({cfg.heads}, {rows}, {cfg.dim}) = (heads, positions, head dim)"
    want = reference(cfg)["out"][:, cfg.block(g)]
    head, row = (~torch.isclose(got.double(), want, **TOL)).any(-1).nonzero()[0].tolist()
    where = f" (first at head {head}, query {row} of rank {rank} = position {g * rows + row} of the sequence)"
    for words, how in mistakes(cfg, g, rank):
        candidate = ring_output(cfg, g, **how)
        if not bool(candidate.isnan().any()) and differ("", candidate, got, **TOL) is None:
            return f"{where}: {words}"
    return where + (". Hint: a key at global position j is visible to query i iff j ≤ i" if cfg.causal else
                    ". Hint: scores are q·kᵀ/√d; merge the blocks with a running max and log-sum-exp")


def traffic_problem(seen: Reader, cfg: Config, g: int, what: str) -> str | None:
    """None if `seen` (a traffic record) is a ring's: point-to-point only, to one ring neighbour in the group and
    from the other, (n−1)·(K block + V block) bytes sent."""
    ops, size = seen["ops"].counts(), len(cfg.members)
    block = cfg.heads * cfg.rows * cfg.dim * 4
    used, whole = sorted(set(ops) - P2P), 2 * size * block
    if used:
        if not any(op.startswith("all_gather") for op in used):
            return (f"{what}: you called {used}; ring attention moves K and V (and their gradients) point-to-point "
                    "only, one block per step to the next rank: pass them with pass_to_next")
        return (f"{what}: you called {used}. An all-gather sends the same (n−1)/n of K and V, but then every rank "
                f"holds the whole sequence's K and V ({whole} B, not the {2 * block} B of the block a ring step works "
                "on) and scores its queries against every key at once — the memory that grows with the sequence, "
                "which context parallelism exists to avoid. Pass one block at a time with pass_to_next")
    peers = {op: set(seen["peers"][op].numbers()) for op in seen["peers"].keys()}
    to = peers.get("isend", set()) | peers.get("send", set())
    heard = peers.get("irecv", set()) | peers.get("recv", set())
    right, left = cfg.members[(g + 1) % size], cfg.members[(g - 1) % size]
    if (to, heard) not in [({right}, {left}), ({left}, {right})]:  # either direction is a ring
        return (f"{what}: rank {cfg.members[g]} sent to rank(s) {sorted(to)} and received from {sorted(heard)}; in a "
                f"ring each rank sends to one neighbour in the group only and receives from the other ({right} and "
                f"{left}, global ranks)")
    want, sent = (size - 1) * 2 * block, seen["sent"].count()
    if sent != want:
        times = f"{sent // (2 * block)} times" if sent % (2 * block) == 0 else "a different amount"
        return (f"{what}: rank {cfg.members[g]} sent {sent} B; the ring passes each block n−1 = {size - 1} times: "
                f"(n−1)·({block} + {block}) = {want} B = (n−1)/n of the whole K and V ({whole} B). You sent "
                f"{times}" + (" — the n-th pass only brings your own block back: pass n−1 times"
                              if sent == size * 2 * block else ""))
    return None


def judge(cfg: Config, g: int, seen: Reader) -> tuple[int, str] | None:
    """(when, problem): the first problem of member g's run of configuration `cfg`, in the order they arise."""
    rank = cfg.members[g]
    ref = reference(cfg)
    label = cfg.label
    mine = cfg.block(g)
    if seen["raised"].value is not None:
        return raised_problem(seen["raised"], label, rank)
    got = seen["out"].tensor()
    problem = differ(f"{label}, output of rank {rank}", ref["out"][:, mine], got, **TOL)
    if problem:
        return OUTPUT, problem + output_hint(cfg, g, rank, got)
    for name, given, after in zip("qkv", ref["qkv"], seen["inputs"].items(3), strict=True):
        problem = differ(f"{label}, rank {rank}'s {name} after your call", given[:, mine], after.tensor(), **TOL)
        if problem:
            return INPUTS, f"{problem}. Your function changed its input {name}: compute on new tensors"
    problem = traffic_problem(seen["forward"], cfg, g, f"{label}, forward")
    if problem:
        return FORWARD, problem
    unused = seen["unused"].numbers()
    if unused:
        calls = seen["passes"].count()
        return PASSES, (f"{label}, rank {rank}: the blocks that {len(unused)} of your {calls} pass_to_next calls "
                        f"(numbers {[c + 1 for c in unused]}, counting from 1) returned never reach your output. "
                        "Their backward — which carries the gradient to the block's owner — would run only on the "
                        "ranks that used them, so the others would wait forever (the check stopped before "
                        "backward). " + ("Skipping a fully masked block is what the chapter's ring does, whose own "
                                         "backward sends K and V round again; here gradients ride on pass_to_next: "
                                         "keep every block in the computation, fully masked" if cfg.causal else
                                         "Use every block you receive"))
    if seen["backward_ran"].value is not True:
        return PASSES + 0.5, (f"{label}, rank {rank}: the check ran no backward, because another rank's output "
                              "left out blocks it had received (that rank's problem says which)")
    for j, (name, want, got) in enumerate(zip(("dQ", "dK", "dV"), ref["grads"], seen["grads"].items(3), strict=True)):
        got = got.tensor()
        problem = differ(f"{label}, {name} of rank {rank}'s rows", want[:, mine], got, **TOL)
        if problem:
            return GRADS + j / 10, problem + grad_hint(ref, g, name, got)
    problem = traffic_problem(seen["backward"], cfg, g, f"{label}, backward")
    return (BACKWARD, problem) if problem else None


def raised_problem(raised: Reader, label: str, rank: int) -> tuple[int, str]:
    """(when, problem) of a learner's error on this rank, as the observe half kept it."""
    error, when = raised["error"].value, raised["when"].value
    if not isinstance(error, str) or when not in ("forward", "backward"):
        raise Malformed(f"{raised.where} is not an error record")
    lines = raised["lines"].numbers(3)
    where = f" (your ring_attention, line {', '.join(map(str, lines))})" if lines else ""
    return (OUTPUT if when == "forward" else GRADS), (f"{label}: rank {rank} raised {error[:300]}{where}"
                                                      + (" in the backward of your output" if when == "backward"
                                                         else ""))


def grad_hint(ref: dict, g: int, name: str, got) -> str:
    """The cause of a wrong gradient, where the evidence names one (the output was right)."""
    if getattr(got, "what", None) == "NoneType" or isinstance(got, torch.Tensor) and not bool(got.any()):
        return f": no gradient reached {name[1].lower()} — your output is cut off from it (.detach(), no_grad, .data)"
    if name != "dQ" and isinstance(got, torch.Tensor):
        own = ref["own"][g][name == "dV"]
        if got.shape == own.shape and differ("", own, got, **TOL) is None:
            return (f": that is the share of your own queries alone — other ranks' queries also read your "
                    f"{name[1]} block, and their share comes back only through pass_to_next's backward: pass "
                    f"{name[1]} with pass_to_next (a bare isend/irecv or a detached block carries no gradient)")
    return ""


@register("ring_attention", nproc=WORLD, observe=observe, given={"pass_to_next": pass_to_next},
          summary="output, dQ, dK and dV equal full softmax attention, non-causal and causal, on the default "
          f"group of {WORLD} ranks and on the group {list(SUBGROUP)} of them, for heads, positions per rank, head "
          "dims and data drawn per run, and each rank sent its K and V blocks n−1 times to one ring neighbour "
          "only — (n−1)/n of K and V — and the same bytes of dK, dV back",
          deadlock_hint="Likely: the ranks called pass_to_next different numbers of times (each passes n − 1 "
          "times, n = dist.get_world_size(group)), or your code sent with its own isend/irecv to a rank that never "
          f"answers (on the group {list(SUBGROUP)}, rank 0 is not in the ring).",
          mismatch_hint="pass_to_next sends a block to the next rank, which receives one shaped like its own: pass "
          "K and V (and nothing else) in the shape they came, (heads, positions per rank, head dim).")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    plan = configs(seed)
    for c, (cfg, seen) in enumerate(zip(plan, observed.items(len(plan)), strict=True)):
        if me in cfg.members:
            found = judge(cfg, cfg.members.index(me), seen)
            if found:
                return [Problem(found[1], at=(c, found[0]))]
    return []
