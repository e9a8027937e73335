"""Exercise 04, a ZeRO-1 step (零冗余优化器): `zero1_step(param, grad, momentum, group, lr, beta)` updates a flat
parameter of P entries with SGD-momentum on the gradient averaged over the group, while each rank keeps (and
updates) only its 1/n shard of the momentum: reduce-scatter the gradients, step the own shard, all-gather the
parameters.

Graded on 4 ranks, in three rounds drawn per run: the default group (group=None), then the groups of a 3 + 1 and
of a 2 + 2 partition of the ranks, each group at once (so a group that does not start at rank 0 is always among
them; every rank calls `dist.new_group` for every group). Per round the run draws P (a multiple of every group
size of the round), 2 to 4 steps, and per group lr and β; the data are drawn from the seed. Against unsharded
SGD-momentum recomputed here, after every step, the earliest wrong quantity told first: each rank's momentum shard
(group rank g owns entries [g·P/n, (g+1)·P/n)), the whole parameter, both updated in the caller's tensors (in
place); the optimizer state the function keeps between calls besides `momentum` (none: a rank holds 1/n of the
state); the bytes a rank sends, 2(n−1)/n·S (what plain data parallelism sends), by reduce-scatter and all-gather,
never an all-reduce.
"""
from __future__ import annotations

import random
import types
from dataclasses import dataclass

import torch
import torch.distributed as dist

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import Problem, register
from partrain_edu.grading.trials import partitions, stream

RANKS = 4
DEFAULT_LR, DEFAULT_BETA = 0.1, 0.9  # the signature's defaults: an answer that ignores lr and beta steps with these
SCATTERS = {"reduce_scatter_single", "reduce_scatter_tensor", "reduce_scatter", "_reduce_scatter_base"}
GATHERS = {"all_gather_single", "all_gather_into_tensor", "all_gather", "_all_gather_base"}


@dataclass(frozen=True)
class Setup:
    """One group's run of steps in a round."""
    members: tuple[int, ...]  # global ranks, ascending (= group-rank order)
    numel: int
    steps: int
    lr: float
    beta: float
    data: int                 # seeds the start parameters and the gradients

    def start(self) -> torch.Tensor:
        return torch.randn(self.numel, generator=torch.Generator().manual_seed(self.data))

    def grad(self, step: int, rank: int) -> torch.Tensor:
        seed = random.Random(f"{self.data}:{step}:{rank}").randrange(2 ** 31)
        return torch.randn(self.numel, generator=torch.Generator().manual_seed(seed))


def rounds(seed: int) -> list[tuple[Setup, ...]]:
    """The run's rounds, each a partition of the ranks into groups that share P and the number of steps."""
    rng = stream(seed, "zero1_step")
    out = []
    for groups in partitions(rng, RANKS):
        unit = max(len(g) for g in groups)  # 4, 3 or 2: every group's size divides it
        numel, steps = unit * rng.randrange(1, 7), rng.randrange(2, 5)
        out.append(tuple(Setup(g, numel, steps, round(rng.uniform(0.02, 0.5), 3), round(rng.uniform(0.5, 0.95), 2),
                               rng.randrange(2 ** 31)) for g in groups))
    return out


def setup_of(rnd: tuple[Setup, ...], rank: int) -> Setup:
    return next(s for s in rnd if rank in s.members)


def kept_tensors(fn, before: set, own: tuple) -> list[list]:
    """[where, bytes] of the tensors `fn` keeps between calls — in its attributes, default arguments, closure,
    or globals it added (`before`: the names there before the first call) — other than the check's own `own`."""
    mine = {t.untyped_storage().data_ptr() for t in own}
    found, seen = [], set()

    def walk(where: str, obj, depth: int) -> None:
        if id(obj) in seen or depth > 4 or isinstance(obj, (types.ModuleType, type, types.FunctionType)):
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.untyped_storage().data_ptr() not in mine:
                found.append([where[:80], obj.numel() * obj.element_size()])
        elif isinstance(obj, dict):
            for key, value in list(obj.items())[:64]:
                walk(f"{where}[{key!r}]", value, depth + 1)
        elif isinstance(obj, (list, tuple, set)):
            for i, value in enumerate(list(obj)[:64]):
                walk(f"{where}[{i}]", value, depth + 1)
        elif hasattr(obj, "__dict__"):
            walk(f"{where}.__dict__", vars(obj), depth + 1)

    name = getattr(fn, "__name__", "your function")
    walk(f"{name}.__dict__", getattr(fn, "__dict__", {}), 0)
    walk(f"{name}'s default arguments", getattr(fn, "__defaults__", None) or (), 0)
    walk(f"{name}'s keyword defaults", getattr(fn, "__kwdefaults__", None) or {}, 0)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            walk(f"{name}'s closure", cell.cell_contents, 0)
        except ValueError:  # an empty cell
            pass
    added = {k: v for k, v in getattr(fn, "__globals__", {}).items() if k not in before}
    walk("the globals", added, 0)
    return found[:8]


def observe(ctx, zero1_step, *, seed: int) -> list[list[dict]]:
    plan = rounds(seed)
    groups = {plan[0][0].members: None}  # the default group is passed as group=None
    for rnd in plan:
        for s in rnd:
            if s.members not in groups:  # every rank makes every group, in the same order, member or not
                groups[s.members] = dist.new_group(list(s.members))
    dist.barrier()  # every group connected on every rank before the learner's code runs (and may exit)
    before = set(getattr(zero1_step, "__globals__", {}))
    out = []
    for rnd in plan:
        s = setup_of(rnd, ctx.rank)
        param, momentum = s.start(), torch.zeros(s.numel // len(s.members))  # this rank's shard: what ZeRO-1 keeps
        steps = []
        for step in range(s.steps):
            grad = s.grad(step, ctx.rank)
            with CommTracer() as tracer:
                zero1_step(param, grad, momentum, groups[s.members], s.lr, s.beta)
            steps.append({"momentum": tensor(momentum), "param": tensor(param),
                          "kept": kept_tensors(zero1_step, before, (param, momentum, grad)), **traffic(tracer)})
        out.append(steps)
    return out


@register("zero1_step", nproc=RANKS, observe=observe,
          summary="on 4 ranks, on the default group and on sub-groups of 1 to 3 ranks, with P, steps, lr and β "
          "drawn per run, every step equals unsharded SGD-momentum on the gradient averaged over the group, each "
          "rank holds and updates only its 1/n of the optimizer state (in `momentum`, nothing kept between "
          "calls), and a step sends 2(n−1)/n·S bytes (what plain data parallelism sends) by reduce-scatter and "
          "all-gather",
          deadlock_hint="Likely: one rank skips a collective (e.g. only the owner all-gathers) — reduce-scatter "
          "and all-gather are called by every rank of the group; or a collective ran on the default group while "
          "the check called zero1_step on a sub-group (pass group=group to every collective).",
          mismatch_hint="Likely: the ranks disagree on the shard size — take n from the group "
          "(dist.get_world_size(group)) and pass group=group to every collective.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    plan = rounds(seed)
    for k, (rnd, seen) in enumerate(zip(plan, observed.items(len(plan)), strict=True)):
        problem = judge(setup_of(rnd, me), me, seen, k)
        if problem:
            return [problem]
    return []


def trajectory(s: Setup, lr: float, beta: float) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """Every group rank's momentum shard and the whole parameter after each step of unsharded SGD-momentum on
    the gradient averaged over the group (float64)."""
    n = len(s.members)
    shard = s.numel // n
    param, momentum = s.start().double(), torch.zeros(s.numel, dtype=torch.float64)
    out = []
    for step in range(s.steps):
        avg = torch.stack([s.grad(step, r).double() for r in s.members]).mean(0)
        momentum = beta * momentum + avg
        param = param - lr * momentum
        out.append(([momentum[g * shard:(g + 1) * shard] for g in range(n)], param))
    return out


def label(s: Setup) -> str:
    where = (f"the default group ({RANKS} ranks" if len(s.members) == RANKS else
             f"the group of rank(s) {list(s.members)} ({len(s.members)} rank(s)")
    return f"{where}; P = {s.numel}, lr = {s.lr:g}, β = {s.beta:g})"


def judge(s: Setup, me: int, steps: Reader, k: int) -> Problem | None:
    """The first problem of rank `me`'s steps in round `k` (setup `s`): momentum, parameters, state kept, traffic."""
    n, g = len(s.members), s.members.index(me)
    shard = s.numel // n
    expected, defaults = trajectory(s, s.lr, s.beta), trajectory(s, DEFAULT_LR, DEFAULT_BETA)
    before_m, before_p = torch.zeros(shard, dtype=torch.float64), s.start().double()
    for step, seen in enumerate(steps.items(s.steps)):
        when = f"{label(s)}, step {step + 1}"
        momentum, param = seen["momentum"].tensor(), seen["param"].tensor()
        want_m = expected[step][0][g]
        problem = differ(f"{when}: momentum shard of rank {me} (group rank {g}, entries {g * shard}:{(g + 1) * shard})",
                         want_m, momentum)
        if problem:
            return Problem(problem + momentum_hint(momentum, want_m, before_m, expected[step][0], defaults[step][0][g],
                                                   s, g), at=(k, step, 0))
        want_p = expected[step][1]
        problem = differ(f"{when}: parameters after the step", want_p, param)
        if problem:
            return Problem(problem + param_hint(param, want_p, before_p, defaults[step][1], s), at=(k, step, 1))
        before_m, before_p = want_m, want_p
        kept = seen["kept"].records(("name", "count"), most=8, what="kept tensors")
        if kept:
            where, size = kept[0]
            return Problem(f"{when}: between calls your function keeps {sum(b for _, b in kept)} B of tensors besides "
                           f"the `momentum` shard it is given (first: {where}, {size} B). ZeRO-1 keeps on each rank "
                           f"only its 1/n of the optimizer state — here {shard * 4} B, all of it in `momentum`; "
                           "keep nothing else from one step to the next.", at=(k, step, 2))
        want, sent = 2 * (n - 1) * s.numel * 4 // n, seen["sent"].count()
        if sent != want:
            return Problem(f"{when}: sent {sent} bytes; ZeRO-1 sends {want} = 2(n−1)/n·S, n the group's size (reduce-"
                           "scatter the gradients, all-gather the parameters)"
                           + (" — an all-reduce of the gradients sends twice what reduce-scatter does: each rank needs "
                              "only its shard" if sent > want else ""), at=(k, step, 3))
        kinds = set(seen["ops"].counts())
        if n > 1 and (not (kinds & SCATTERS and kinds & GATHERS) or "all_reduce" in kinds):
            return Problem(f"{when}: you called {sorted(kinds)}; ZeRO-1 reduce-scatters the gradients (each rank needs "
                           "only its shard's sum) and all-gathers the updated parameters — an all-reduce means some "
                           "rank computed on entries it does not own", at=(k, step, 3))
    return None


def momentum_hint(got, want, before, shards, default, s: Setup, g: int) -> str:
    """The likely cause of a wrong momentum shard, where the evidence names one."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return ""
    n = len(s.members)
    if differ("", before, got) is None:
        return (". It is what it was before the step: update `momentum` in place (momentum.mul_(beta).add_(…)) — "
                "the check keeps the tensor it gave you.")
    r = ratio_of(want, got)
    if r and n > 1 and abs(r - n) < 1e-3:
        return f". Missing average: divide the reduced gradient by the group's size {n}."
    other = [h for h in range(n) if h != g and differ("", shards[h], got) is None]
    if other:
        return (f". That is group rank {other[0]}'s shard (rank {s.members[other[0]]}): group rank g owns entries "
                "[g·P/n, (g+1)·P/n), g = dist.get_rank(group).")
    if differ("", default, got) is None:
        return f". That is β = {DEFAULT_BETA:g}, the default: step with the `beta` you are given."
    return ""


def param_hint(got, want, before, default, s: Setup) -> str:
    """The likely cause of wrong parameters, where the evidence names one."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return ""
    if differ("", before, got) is None:
        return (". They are what they were before the step: either `param` was not updated in place on every rank "
                "(copy the gathered parameters into it — the check keeps the tensor it gave you), or the step used "
                "the momentum from before this step (m ← β·m + ḡ first, then param ← param − lr·m)")
    if differ("", default, got) is None:
        return f". That is lr = {DEFAULT_LR:g}, the default: step with the `lr` you are given."
    n, shard = len(s.members), s.numel // len(s.members)
    pieces = [slice(h * shard, (h + 1) * shard) for h in range(n)]
    bad = [h for h in range(n) if differ("", want[pieces[h]], got[pieces[h]])]
    stale = all(differ("", before[pieces[h]], got[pieces[h]]) is None for h in bad)
    return (f". Wrong entries belong to the shard(s) of group rank(s) {bad}"
            + (", and they hold what they held before the step" if stale else "")
            + ": after updating its own shard each rank must all-gather the others' updated shards into `param` "
            "itself (in place).")
