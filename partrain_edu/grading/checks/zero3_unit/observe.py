"""Check `zero3_unit`, what both halves share — the runs drawn from the seed, each group's model and batches, the
flat sharded layout — and the observe half, which runs on the 4 ranks beside the learner's `fsdp_step` and
follows every tensor the given `gather` returns (see the package's docstring).
"""
from __future__ import annotations

import gc
import math
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist

from partrain_edu.comm import CommTracer
from partrain_edu.grading.givens.zero3_unit import gather
from partrain_edu.grading.observations import tensor, traffic
from partrain_edu.grading.trials import stream

NPROC = 4
WORLD = (tuple(range(NPROC)),)   # the default group (group=None) as a layout
# Splits of the 4 ranks into FSDP groups, each with a group of ≥ 2 that does not start at rank 0. Each group trains
# its own model at the same time as the others.
SPLITS = (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2)), ((0,), (1, 2, 3)))


@dataclass(frozen=True)
class Run:
    """One training run: its groups, the width d, the c outputs, the number of units, rows per batch, steps, lr."""
    layout: tuple
    d: int
    c: int
    units: int
    rows: int
    steps: int
    lr: float

    @property
    def names(self) -> tuple[str, ...]:   # the order of the shards: the root's head, then the units
        return ("root", *(f"unit {k}" for k in range(self.units)))


def runs(seed: int) -> list[Run]:
    """The runs of grading run `seed`, in a drawn order: one on the default group of all 4 ranks and one on a
    split. d ≥ 5 > c keeps the root's flat tensor apart from a unit's by its size."""
    rng = stream(seed, "zero3_unit runs")
    layouts = [WORLD, rng.choice(SPLITS)]
    rng.shuffle(layouts)
    return [Run(layout, d=rng.randint(5, 12), c=rng.randint(1, 4), units=rng.randint(2, 4), rows=rng.randint(2, 5),
                steps=rng.randint(2, 3), lr=round(rng.uniform(0.05, 0.5), 3)) for layout in layouts]


def mine(layout: tuple, rank: int) -> tuple[int, tuple[int, ...]]:
    """(index in the layout, members) of the group holding global rank `rank`."""
    return next((j, g) for j, g in enumerate(layout) if rank in g)


def generator(seed: int, *what) -> torch.Generator:
    return torch.Generator().manual_seed(stream(seed, " ".join(map(str, what))).getrandbits(63))


def model(seed: int, k: int, group: int, run: Run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(weight, bias) of the root's head Linear(d, c), then of each unit's Linear(d, d), unsharded: group `group`
    of run `k` trains this model."""
    gen = generator(seed, "zero3_unit model", k, group)
    units = [(torch.randn(run.d, run.d, generator=gen) / math.sqrt(run.d), 0.1 * torch.randn(run.d, generator=gen))
             for _ in range(run.units)]
    return [(torch.randn(run.c, run.d, generator=gen) / math.sqrt(run.d), 0.1 * torch.randn(run.c, generator=gen)),
            *units]


def batch(seed: int, k: int, step: int, rank: int, run: Run) -> tuple[torch.Tensor, torch.Tensor]:
    """Global rank `rank`'s (x, y) of step `step` of run `k`."""
    gen = generator(seed, "zero3_unit batch", k, step, rank)
    return torch.randn(run.rows, run.d, generator=gen), torch.randn(run.rows, run.c, generator=gen)


def padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def flat(weight: torch.Tensor, bias: torch.Tensor, n: int) -> torch.Tensor:
    """(padded,) weight then bias then zeros: the layout FSDP's FlatParameter gives a unit."""
    values = torch.cat([weight.detach().reshape(-1), bias.detach()])
    return torch.cat([values, values.new_zeros(padded(values.numel(), n) - values.numel())])


def shard(full: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    size = full.numel() // n
    return full[rank * size:(rank + 1) * size].clone()


def nbytes(run: Run, n: int) -> dict[str, int]:
    """Bytes of the root's and of a unit's full (padded) flat parameters in float32, in a group of n."""
    return {"root": 4 * padded(run.c * run.d + run.c, n), "unit": 4 * padded(run.d * run.d + run.d, n)}


class _Gathered:
    """The full parameters `gather` returned that are still alive: weakref.finalize drops one when the tensor
    dies — when its last name, view and autograd-saved reference are gone."""

    def __init__(self):
        self.names: dict[int, str] = {}     # storage address of a shard -> its name
        self.alive: dict[int, tuple[str, int, str]] = {}    # serial -> (name, bytes, "forward"/"backward")
        self.serial, self.events = 0, []
        self.bound, self.collected = 0, False   # root + one unit (bytes); a full collection was made this step

    def settle(self, new: int) -> None:
        """Collect the garbage reference cycles hold, when the bytes alive plus `new` exceed the bound: young
        generations first (fast), then at most one full collection a step (0.1-0.5 s): if that one leaves the
        bytes over the bound, the step fails whatever later gathers find."""
        if sum(b for _, b, _ in self.alive.values()) + new > self.bound:
            gc.collect(1)
        if sum(b for _, b, _ in self.alive.values()) + new > self.bound and not self.collected:
            self.collected = True
            gc.collect()

    def opened(self, full: torch.Tensor, shard: torch.Tensor) -> None:
        name = self.names.get(shard.untyped_storage().data_ptr(), f"a copy of a shard ({shard.numel()} values)")
        in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1   # -1: not in backward
        self.serial += 1
        self.alive[self.serial] = (name, full.numel() * full.element_size(), "backward" if in_backward else "forward")
        weakref.finalize(full, self.alive.pop, self.serial, None)   # holds no reference to `full`
        self.events.append({"of": name, "backward": in_backward, "alive": [list(a) for a in self.alive.values()]})


GATHERED = _Gathered()


def tracked_gather(shard, group=None):
    """The given `gather`, as the learner's code calls it on the ranks, followed by the check. It hands out a copy:
    Gloo's worker thread may hold the collective's output a moment after the call returned (about 3 calls in 10
    on 2 ranks here), which would keep it alive past the learner's last reference; the copy is the caller's alone."""
    full = gather(shard, group).clone()
    GATHERED.settle(full.numel() * full.element_size())   # count only what the code really keeps alive
    GATHERED.opened(full, shard)
    return full


def _loss(value) -> dict:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return tensor(value.detach().reshape(()))
    return tensor(torch.tensor(float(value)) if isinstance(value, (int, float)) else value)


def observe(ctx, fsdp_step, *, seed: int) -> list[list[dict]]:
    out = []
    for k, run in enumerate(runs(seed)):
        # every rank makes every group, in the same order (dist.new_group is collective); None: the default group
        groups = [None] if run.layout == WORLD else [dist.new_group(list(g)) for g in run.layout]
        j, members = mine(run.layout, ctx.rank)
        n, me = len(members), members.index(ctx.rank)
        # this rank's 1/n of each flat tensor, a leaf that requires grad: FSDP's sharded FlatParameter
        shards = [shard(flat(w, b, n), me, n).requires_grad_() for w, b in model(seed, k, j, run)]
        GATHERED.names = {s.untyped_storage().data_ptr(): name for s, name in zip(shards, run.names, strict=True)}
        GATHERED.bound = sum(nbytes(run, n).values())
        steps = []
        for step in range(run.steps):
            x, y = batch(seed, k, step, ctx.rank, run)
            x.requires_grad_()   # as an earlier stage's output: every unit's backward needs its weight for dL/dh
            GATHERED.events, GATHERED.collected = [], False
            with CommTracer() as tracer:
                loss = fsdp_step(shards[0], shards[1:], x, y, run.lr, groups[j])
            loss = _loss(loss)   # drops the learner's loss tensor (and the graph it may hold)
            GATHERED.collected, GATHERED.bound = False, 0
            GATHERED.settle(0)   # a reference cycle the collector frees is no leak
            GATHERED.bound = sum(nbytes(run, n).values())
            steps.append({"loss": loss, "shards": [tensor(s) for s in shards], "x_grad": tensor(x.grad),
                          "inputs": [tensor(x), tensor(y)], **traffic(tracer),
                          "calls": [[r.op, r.bytes] for r in tracer.records],
                          "groups": [list(r.group_ranks) for r in tracer.records], "gathers": GATHERED.events,
                          "alive_after": [list(a) for a in GATHERED.alive.values()]})
        out.append(steps)
    return out
