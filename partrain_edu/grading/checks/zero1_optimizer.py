"""Exercise 04, a ZeRO-1 step (零冗余优化器) on 2 ranks: `zero1_step(param, grad, momentum, group, lr, beta)`
updates a 12-element parameter with SGD-momentum on the gradient averaged over ranks, while each rank keeps
(and updates) only its 1/n shard of the momentum: reduce-scatter the gradients, step the own shard, all-gather
the parameters.

Graded over 3 steps against unsharded SGD-momentum recomputed here: each rank's momentum shard and the whole
parameter after each step; a step sends 2(n−1)/n·S bytes (what plain data parallelism sends), by
reduce-scatter and all-gather, never an all-reduce.
"""
from __future__ import annotations

import torch

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import register
from partrain_edu.parallel.ring import chunk_bounds

ZERO1_NUMEL, ZERO1_STEPS, ZERO1_LR, ZERO1_BETA = 12, 3, 0.1, 0.9


def zero1_start() -> torch.Tensor:
    return torch.linspace(-1, 1, ZERO1_NUMEL)


def zero1_grad(step: int, rank: int) -> torch.Tensor:
    return torch.randn(ZERO1_NUMEL, generator=torch.Generator().manual_seed(7 * step + rank))


def observe(ctx, zero1_step, *, seed: int) -> list[dict]:
    param = zero1_start()
    momentum = torch.zeros(ZERO1_NUMEL // ctx.world_size)  # this rank's shard: what ZeRO-1 keeps
    steps = []
    for step in range(ZERO1_STEPS):
        with CommTracer() as tracer:
            zero1_step(param, zero1_grad(step, ctx.rank), momentum, None, ZERO1_LR, ZERO1_BETA)
        steps.append({"momentum": tensor(momentum), "param": tensor(param), **traffic(tracer)})
    return steps


@register("zero1_step", nproc=2, observe=observe,
          summary="3 steps equal unsharded SGD-momentum on the averaged gradient, each "
          "rank holds and updates only its 1/n of the optimizer state, and a step sends 2(n−1)/n·S bytes "
          "(what plain data parallelism sends) by reduce-scatter and all-gather",
          deadlock_hint="Likely: one rank skips a collective (e.g. only the owner all-gathers) — reduce-scatter "
          "and all-gather are called by every rank.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    numel, lr, beta = ZERO1_NUMEL, ZERO1_LR, ZERO1_BETA
    bounds = chunk_bounds(numel, n)
    expected_param = zero1_start()
    expected_m = [torch.zeros(e - s) for s, e in bounds]  # every rank's state: plain SGD-momentum, sharded
    for step, seen in enumerate(observed.items(ZERO1_STEPS)):
        avg = torch.stack([zero1_grad(step, r) for r in range(n)]).mean(0)
        for r, (s, e) in enumerate(bounds):
            expected_m[r].mul_(beta).add_(avg[s:e])
            expected_param[s:e] -= lr * expected_m[r]
        momentum = seen["momentum"].tensor()
        problem = differ(f"step {step + 1}, momentum shard of rank {me} (entries {bounds[me]})", expected_m[me],
                         momentum)
        if problem:
            r = ratio_of(expected_m[me], momentum)
            other = [k for k in range(n) if k != me and differ("", expected_m[k], momentum) is None]
            hint = (f" Missing average: divide the reduced gradient by {n}." if r and abs(r - n) < 1e-3 else
                    f" That is rank {other[0]}'s shard: rank r owns entries [r·P/n, (r+1)·P/n)." if other else "")
            return [problem + hint]
        param = seen["param"].tensor()
        problem = differ(f"step {step + 1}, parameters after the step", expected_param, param)
        if problem:
            if not (isinstance(param, torch.Tensor) and param.shape == expected_param.shape):
                return [problem]
            bad = [k for k, (s, e) in enumerate(bounds) if differ("", expected_param[s:e], param[s:e])]
            return [problem + f". Wrong entries belong to rank(s) {bad}'s shard: after updating its own "
                    "shard each rank must all-gather the others' updated shards."]
        want, sent = 2 * (n - 1) * numel * 4 // n, seen["sent"].count()
        if sent != want:
            return [f"step {step + 1}: sent {sent} bytes; ZeRO-1 sends {want} = 2(n−1)/n·S (reduce-scatter the "
                    "gradients, all-gather the parameters)"
                    + (" — an all-reduce of the gradients sends twice what reduce-scatter does: each rank needs "
                       "only its shard" if sent > want else "")]
        kinds = set(seen["ops"].counts())
        scattered = kinds & {"reduce_scatter_tensor", "reduce_scatter"}
        gathered = kinds & {"all_gather_into_tensor", "all_gather"}
        if not (scattered and gathered) or "all_reduce" in kinds:
            return [f"step {step + 1}: you called {sorted(kinds)}; ZeRO-1 reduce-scatters the gradients (each rank "
                    "needs only its shard's sum) and all-gathers the updated parameters — an all-reduce means "
                    "some rank computed on entries it does not own"]
    return []
