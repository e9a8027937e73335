"""Pipeline parallelism (流水线并行) over any list of layers: slices on p stages, micro-batches flowing through.

    stage = Stage(layers, *split_layers(layers, p)[s])          # layers: an nn.Sequential (or list); rank s, slice s
    mail = Mailbox(infer_boundaries([stage], s, ranks, x[:b]), m)  # each boundary's (b, …) shape, measured once
    PipelineExecutor(build_schedule("1f1b", p, m), [stage], s, ranks, mail, F.mse_loss).step(x, y)

**Sharded**: the layers, balanced by parameter count or at given boundaries; with interleaving (Narayanan et al.
2021, §2.2.2) V chunks, virtual stage v = chunk·p + s. **Communicated** (pp_comm.py): per micro-batch and
boundary, the activation forward and its gradient back; a middle stage sends 2m messages per step.
**Schedule**: rank s runs exactly `theory.schedules.build_schedule(...).actions[s]`; each action waits only for its
message: the bubble (气泡), (p−1)/(m+p−1) for GPipe (Huang et al. 2019) and 1F1B; ZB-H1's split B and W (Qi et
al. 2024): zero_bubble.py. Events are recorded in the simulator's shape and stashed activations counted (GPipe m,
1F1B p − s, ZB-H1 p: W holds its graph). **Equivalence**: gradients are Σ_mb (loss_mb / m)', one process's
accumulation. TinyGPT's stages (embedding first, head last) and the pp-* strategies: strategies/pipeline.py.
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from itertools import accumulate, pairwise

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.data import split_microbatches
from partrain_edu.parallel.pp_comm import Boundary, Mailbox

# backward_input too: the B and W halves were defined here first (notebook 13 points at this file for them)
from partrain_edu.parallel.zero_bubble import SplitBackward, backward_input, backward_weight  # noqa: F401
from partrain_edu.theory.schedules import Schedule


def _params(module: nn.Module | None) -> int:
    return 0 if module is None else sum(p.numel() for p in module.parameters())


def _balanced_cuts(costs: list[int], parts: int) -> list[int]:
    """The cuts of a contiguous split into `parts` whose largest part costs least (ties: the earliest cuts)."""
    n, prefix = len(costs), list(accumulate(costs, initial=0))
    # tail[k][i]: the least possible largest part when layers i, …, n−1 form k parts (dynamic programming)
    tail = [[0 if i == n else float("inf") for i in range(n + 1)]]
    for k in range(1, parts + 1):
        tail.append([min((max(prefix[c] - prefix[i], tail[k - 1][c]) for c in range(i + 1, n - k + 2)),
                         default=float("inf")) for i in range(n + 1)])
    cuts, i = [], 0
    for k in range(parts, 1, -1):  # the earliest cut that still reaches the optimum
        i = next(c for c in range(i + 1, n - k + 2) if max(prefix[c] - prefix[i], tail[k - 1][c]) <= tail[parts][0])
        cuts.append(i)
    return cuts


def split_layers(layers, parts: int, boundaries: list[int] | None = None, pre: nn.Module | None = None,
                 post: nn.Module | None = None) -> list[tuple[int, int]]:
    """Layer ranges [lo, hi) of `layers` (a list or nn.Sequential) for `parts` (virtual) stages: at `boundaries`
    (the first layer of stages 1, 2, …), or the contiguous split whose largest stage has the fewest parameters,
    counting `pre` (run before layer 0: an embedding) with the first stage and `post` (a head) with the last."""
    n = len(layers)
    if not 0 < parts <= n:
        raise ValueError(f"{parts} pipeline stages for the model's {n} layers: use at least 1 and at most {n} stages")
    if boundaries is not None:
        cuts = list(boundaries)
        if len(cuts) != parts - 1 or cuts != sorted(set(cuts)) or (cuts and not 0 < cuts[0] <= cuts[-1] < n):
            raise ValueError(f"boundaries must be {parts - 1} increasing layer indices in 1..{n - 1}, got {cuts}")
    else:
        costs = [_params(layer) for layer in layers]
        costs[0] += _params(pre)
        costs[-1] += _params(post)
        cuts = _balanced_cuts(costs, parts)
    edges = [0, *cuts, n]
    return list(pairwise(edges))


class Stage(nn.Module):
    """Layers [lo, hi) of `layers`, run in order, after `pre` and before `post` when given (an embedding on the
    first stage, a head on the last). Parameter names keep each layer's index in the list (`blocks.3.weight` is
    layer 3's); `layers` is (lo, hi)."""

    def __init__(self, layers, lo: int, hi: int, pre: nn.Module | None = None, post: nn.Module | None = None):
        super().__init__()
        self.layers, self.pre = (lo, hi), pre
        self.blocks = nn.ModuleDict({str(i): layers[i] for i in range(lo, hi)})
        self.post = post

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x if self.pre is None else self.pre(x)
        for block in self.blocks.values():
            x = block(x)
        return x if self.post is None else self.post(x)


@torch.no_grad()
def infer_boundaries(chunks: list[nn.Module], stage: int, ranks: list[int], sample: torch.Tensor,
                     group=None) -> list[Boundary]:
    """What each virtual stage v < V−1 sends to v + 1 per micro-batch, measured (every rank must call): virtual
    stage 0 runs on `sample` (one micro-batch of the pipeline's input; other ranks use only its device), each next
    one on zeros of the shape just found, and its owner broadcasts the result over `group` (the pipeline's).
    One forward per chunk, no autograd, in eval mode (no BatchNorm statistic moves)."""
    p, found = len(ranks), []
    for v in range(len(chunks) * p - 1):
        box: list[Boundary | None] = [None]
        if v % p == stage:
            chunk = chunks[v // p]
            x = sample if v == 0 else torch.zeros(found[-1].shape, dtype=found[-1].dtype, device=sample.device)
            modes = [m.training for m in chunk.modules()]
            out = chunk.eval()(x)
            for m, mode in zip(chunk.modules(), modes, strict=True):
                m.training = mode
            box[0] = Boundary(tuple(out.shape), out.dtype)
        dist.broadcast_object_list(box, src=ranks[v % p], group=group)
        found.append(box[0])
    return found


class PipelineExecutor:
    """Runs one rank's action list of a `Schedule` over its `chunks` (any modules: virtual stages stage, stage + p,
    …), with real sends/receives through `mailbox`, `ranks[s]` being stage s's rank; records what ran when."""

    def __init__(self, schedule: Schedule, chunks: list[nn.Module], stage: int, ranks: list[int],
                 mailbox: Mailbox, loss_fn, clock=time.perf_counter):
        self.schedule = schedule
        self.chunks = chunks
        self.stage = stage
        self.ranks = ranks
        self.mail = mailbox
        self.loss_fn = loss_fn  # (last virtual stage's output, targets) → the micro-batch's mean loss
        self.clock = clock      # what events are timed with: wall time, or an emulated device's clock
        self.charged = None     # (kind, chunk) → a context around each action's work: an emulated device's cost
        virtual = schedule.stages * schedule.chunks
        if (len(chunks), len(ranks), mailbox.vs) != (schedule.chunks, schedule.stages, virtual):
            raise ValueError(f"schedule {schedule.name!r} has {schedule.stages} stages of {schedule.chunks} chunks: "
                             f"give {schedule.chunks} chunks, {schedule.stages} ranks and a Mailbox of "
                             f"{virtual - 1} boundaries (got {len(chunks)}, {len(ranks)}, {mailbox.vs - 1})")
        self.p, self.last_virtual = schedule.stages, virtual - 1
        self.split = SplitBackward(chunks, schedule.split_backward)   # whole, or ZB's B and W: zero_bubble.py
        self.events: list[dict] = []       # this rank's last step, in seconds of `clock`
        self.peak = 0                      # most (micro-batch, chunk) activations stashed at once, last step

    def rank_of(self, virtual: int) -> int:
        return self.ranks[virtual % self.p]

    def _work(self, kind: str, chunk: int):
        return nullcontext() if self.charged is None else self.charged(kind, chunk)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """Forward and backward of every micro-batch, in the schedule's order. Gradients accumulate in the
        chunks' parameters; returns (loss sum, samples) on the last stage, (0.0, 0) elsewhere."""
        m = 1 if self.schedule.batch_scale > 1 else self.schedule.microbatches  # naive: one whole batch
        micro = split_microbatches(x, y, m)          # [(B/m, …), (B/m, …)] per micro-batch
        stash: dict[tuple[int, int], tuple] = {}     # (mb, chunk) → (input, output, recorded), then W's work
        self.events = []
        self.peak = 0
        loss_sum = 0.0
        for a in self.schedule.actions[self.stage]:
            v, key = a.chunk * self.p + self.stage, (a.microbatch, a.chunk)
            if a.kind == "F":
                if v == 0:
                    inp = micro[a.microbatch][0]
                else:  # wait for the previous virtual stage's activation (the bubble, if it is late)
                    inp = self.mail.recv(self.rank_of(v - 1), "F", a.microbatch, v).requires_grad_()
                start = self.clock()
                with self._work("F", a.chunk), self.split.record(a.chunk) as recorded:
                    out = self.chunks[a.chunk](inp)
                if v == self.last_virtual:
                    yb = micro[a.microbatch][1]
                    loss = self.loss_fn(out, yb)
                    loss_sum += loss.item() * yb.size(0)
                    out = loss / m                   # backward from the scaled loss, as `accumulate`
                self.split.check(a.chunk, out, recorded)
                end = self.clock()            # before the send: the receiver cannot start earlier
                if v != self.last_virtual:
                    self.mail.send(out, self.rank_of(v + 1), "F", a.microbatch, v + 1)
                stash[key] = (inp, out, recorded)
                self.peak = max(self.peak, len(stash))
            elif a.kind == "B":
                grad = None if v == self.last_virtual else self.mail.recv(self.rank_of(v + 1), "B", a.microbatch, v)
                start = self.clock()
                inp, out, recorded = stash.pop(key)  # frees this micro-batch's activations, unless W needs them
                with self._work("B", a.chunk):
                    inp_grad, weights_later = self.split.backward(out, grad, inp, recorded)
                if weights_later is not None:        # ZB: W's share waits in the stash
                    stash[key] = weights_later
                end = self.clock()
                if v > 0:
                    self.mail.send(inp_grad, self.rank_of(v - 1), "B", a.microbatch, v - 1)
            else:                                    # W: the weight gradients, then the graph is let go
                start = self.clock()
                with self._work("W", a.chunk):
                    backward_weight(stash.pop(key))
                end = self.clock()
            self.events.append({"stage": self.stage, "microbatch": a.microbatch, "chunk": a.chunk,
                                "kind": a.kind, "start": start, "end": end})
        self.mail.flush()
        owns_loss = self.last_virtual % self.p == self.stage
        return (loss_sum, x.size(0)) if owns_loss else (0.0, 0)


def gather_timeline(events: list[dict], group=None) -> list[dict]:
    """Every rank's events of the last step, in seconds from the earliest start (one host's monotonic
    clock is shared by its processes; across hosts clocks would need aligning first)."""
    everyone: list[list[dict]] = [[] for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(everyone, events, group=group)
    t0 = min(e["start"] for rank in everyone for e in rank)
    return [{**e, "start": e["start"] - t0, "end": e["end"] - t0} for rank in everyone for e in rank]


def measured_bubble(events: list[dict], stages: int) -> float:
    """Idle stage-time / (p × makespan), as the simulator defines it, from measured events."""
    makespan = max(e["end"] for e in events) - min(e["start"] for e in events)
    busy = sum(e["end"] - e["start"] for e in events)
    return 1 - busy / (stages * makespan)
