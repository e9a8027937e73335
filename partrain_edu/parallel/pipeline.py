"""Pipeline parallelism (流水线并行): TinyGPT cut into stages, micro-batches flowing through them.

    partrain-edu train --strategy pp-1f1b --nproc 4 --pp 4 --microbatches 8 --json
    partrain-edu train --strategy pp-gpipe --nproc 2 --microbatches 4 --json
    partrain-edu train --strategy pp-interleaved --nproc 2 --microbatches 4 --json   # 2 chunks per rank

**Sharded**: the layers. Rank s holds a contiguous run of blocks (the embedding on the first stage, ln_f +
head + loss on the last), chosen to balance parameter counts or at given boundaries. With interleaving
(Narayanan et al. 2021, §2.2.2) each rank holds V chunks: virtual stage v = chunk·p + s.

**Communicated** (pp_comm.py): per micro-batch and boundary, the (B/m, T, H) activation forward and its
gradient back — `theory.traffic`'s "pp": a middle stage sends 2m messages of (B/m)·T·H·4 bytes per step.

**Schedule**: the executor runs, on rank s, exactly `theory.schedules.build_schedule(...).actions[s]` — the
lists the simulator runs — so a stage's order of work is the schedule's, not this file's. Each action blocks
only on the message it needs (F on the previous virtual stage's activation, B on the next one's gradient);
those waits are the bubble, (p−1)/(m+p−1) for GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush). Each
action's real start (after its message arrived) and end (before it sends its result) are recorded in the
simulator's event shape (stage, microbatch, chunk, kind, start, end), so `viz.pipeline.pipeline_figure`
draws the measured timeline like the simulated one, and the activations each stage holds (stashed for
backward) are counted: GPipe m, 1F1B p − s.

**Equivalence**: gradients are the sum over micro-batches of (loss_mb / m)', exactly `single`'s
accumulation, so the losses equal `single`'s. Only the last stage computes the loss and returns
(loss_sum, count); the others return (0.0, 0).
"""
from __future__ import annotations

import itertools
import time
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.data import split_microbatches
from partrain_edu.models import TinyGPT, count_params
from partrain_edu.parallel.pp_comm import Mailbox, agree_on_shapes
from partrain_edu.theory.schedules import Schedule, build_schedule
from partrain_edu.train import Strategy, TrainConfig, register


def split_layers(model: TinyGPT, parts: int, boundaries: list[int] | None = None) -> list[tuple[int, int]]:
    """Layer ranges [lo, hi) for `parts` (virtual) stages: at `boundaries` (the first layer of stages 1..),
    or the contiguous split whose largest stage (embedding on the first, ln_f + head on the last) has the
    fewest parameters."""
    n = len(model.blocks)
    if parts > n:
        raise ValueError(f"{parts} pipeline stages is more than the model's {n} layers; use at most {n} stages")
    if boundaries is not None:
        cuts = list(boundaries)
        if len(cuts) != parts - 1 or cuts != sorted(set(cuts)) or (cuts and not 0 < cuts[0] <= cuts[-1] < n):
            raise ValueError(f"boundaries must be {parts - 1} increasing layer indices in 1..{n - 1}, got {cuts}")
    else:
        block = [count_params(b) for b in model.blocks]
        head = count_params(model.ln_f) + count_params(model.head)
        embed = count_params(model.wte) + count_params(model.wpe)

        def largest(c):
            edges = [0, *c, n]
            sizes = [sum(block[a:b]) for a, b in zip(edges, edges[1:])]
            sizes[0] += embed
            sizes[-1] += head
            return max(sizes)
        cuts = list(min(itertools.combinations(range(1, n), parts - 1), key=largest))
    edges = [0, *cuts, n]
    return list(zip(edges, edges[1:]))


class StageModule(nn.Module):
    """Layers [lo, hi) of a TinyGPT, with the embedding if first and ln_f + head if last; parameter names
    stay TinyGPT's (blocks.2.attn.q.weight …). forward: tokens (B, T) or activations (B, T, H) →
    activations (B, T, H), or logits (B, T, V) on the last stage."""

    def __init__(self, model: TinyGPT, lo: int, hi: int, first: bool, last: bool):
        super().__init__()
        self.layers, self.first, self.last = (lo, hi), first, last
        if first:
            self.wte, self.wpe = model.wte, model.wpe
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(lo, hi)})
        if last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.wte(x) + self.wpe(torch.arange(x.size(1), device=x.device))  # (B, T) → (B, T, H)
        for block in self.blocks.values():
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x


class PipelineExecutor:
    """Runs one rank's action list of a `Schedule`, with real sends/receives; records what ran when."""

    def __init__(self, schedule: Schedule, chunks: list[StageModule], stage: int, ranks: list[int],
                 mailbox: Mailbox, loss_fn=TinyGPT.loss):
        self.schedule, self.chunks, self.stage, self.ranks, self.mail = schedule, chunks, stage, ranks, mailbox
        self.loss_fn = loss_fn  # (last stage's output, targets) → mean loss; hybrid.py passes the vocab-parallel one
        self.p, self.last_virtual = schedule.stages, schedule.stages * schedule.chunks - 1
        self.events: list[dict] = []       # this rank's last step, perf_counter seconds
        self.peak = 0                      # most (micro-batch, chunk) activations stashed at once, last step

    def rank_of(self, virtual: int) -> int:
        return self.ranks[virtual % self.p]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """Forward and backward of every micro-batch, in the schedule's order. Gradients accumulate in the
        chunks' parameters; returns (loss sum, samples) on the last stage, (0.0, 0) elsewhere."""
        m = 1 if self.schedule.batch_scale > 1 else self.schedule.microbatches  # naive: one whole batch
        micro = split_microbatches(x, y, m)          # [(B/m, T), (B/m, T)] per micro-batch
        stash: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (mb, chunk) → (input, output)
        self.events, self.peak, loss_sum = [], 0, 0.0
        for a in self.schedule.actions[self.stage]:
            v = a.chunk * self.p + self.stage
            if a.kind == "F":
                if v == 0:
                    inp = micro[a.microbatch][0]
                else:  # wait for the previous virtual stage's activation (the bubble, if it is late)
                    inp = self.mail.recv(self.rank_of(v - 1), "F", a.microbatch, v).requires_grad_()
                start = time.perf_counter()
                out = self.chunks[a.chunk](inp)
                if v == self.last_virtual:
                    yb = micro[a.microbatch][1]
                    loss = self.loss_fn(out, yb)
                    loss_sum += loss.item() * yb.size(0)
                    out = loss / m                   # backward from the scaled loss, as `accumulate`
                end = time.perf_counter()            # before the send: the receiver cannot start earlier
                if v != self.last_virtual:
                    self.mail.send(out, self.rank_of(v + 1), "F", a.microbatch, v + 1)
                stash[a.microbatch, a.chunk] = (inp, out)
                self.peak = max(self.peak, len(stash))
            elif a.kind == "B":
                grad = None if v == self.last_virtual else self.mail.recv(self.rank_of(v + 1), "B", a.microbatch, v)
                start = time.perf_counter()
                inp, out = stash.pop((a.microbatch, a.chunk))   # frees this micro-batch's activations
                out.backward(grad)
                end = time.perf_counter()
                if v > 0:
                    self.mail.send(inp.grad, self.rank_of(v - 1), "B", a.microbatch, v - 1)
            else:
                raise ValueError(f"schedule {self.schedule.name!r} splits W from B; this executor runs "
                                 "F and B only (pick naive, gpipe, 1f1b or interleaved)")
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


def profile_step(ctx, cfg: TrainConfig, boundaries: list[int] | None = None, warmup: int = 1) -> dict:
    """Run `cfg.strategy` (a pp-* strategy) for `warmup` steps, then one more that is measured; every rank
    returns {"events": all ranks' events (s from the first start), "peaks": per stage, "bubble": measured}."""
    from partrain_edu.data import SyntheticTokens
    from partrain_edu.train import get_strategy

    if not issubclass(get_strategy(cfg.strategy), PipelineParallel):
        raise ValueError(f"profile_step runs our executor: pick pp-naive, pp-gpipe, pp-1f1b or pp-interleaved, "
                         f"not {cfg.strategy}")
    strategy = get_strategy(cfg.strategy)(ctx, cfg, boundaries=boundaries)
    data = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=cfg.seed)
    for step in range(warmup + 1):
        dist.barrier()  # start each step together, so the first stage's lead is not counted as bubble
        strategy.train_step(*data.global_batch(step, cfg.global_batch))
    events = gather_timeline(strategy.executor.events)
    peaks: list[int] = [0] * ctx.world_size
    dist.all_gather_object(peaks, strategy.executor.peak)
    return {"events": events, "peaks": peaks, "bubble": measured_bubble(events, strategy.pp)}


def check_pipeline(cfg: TrainConfig, name: str, chunks: int = 1) -> int:
    """p for a pipeline-only run of `cfg`, or a one-line ValueError naming the fix."""
    p = cfg.pp or cfg.nproc
    if p != cfg.nproc or (cfg.dp or 1) != 1 or (cfg.tp or 1) != 1:
        raise ValueError(f"{name} is pipeline parallelism alone: give --pp equal to --nproc (got --pp {p}, "
                         f"--nproc {cfg.nproc}) and no --dp/--tp; the 3d strategy combines them")
    layers = cfg.model.n_layer
    if p * chunks > layers:
        raise ValueError(f"{name} needs --pp × {chunks} chunks ≤ the model's {layers} layers: use --pp "
                         f"{layers // chunks} or less" if chunks > 1 else
                         f"--pp {p} is more stages than the model's {layers} layers: use --pp {layers} or less")
    if chunks > 1 and cfg.microbatches % p:
        raise ValueError(f"{name} sends micro-batches in groups of --pp {p}: use --microbatches a multiple of "
                         f"{p} (got {cfg.microbatches})")
    if cfg.global_batch % cfg.microbatches:
        raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by --microbatches {cfg.microbatches}")
    return p


def build_stages(cfg: TrainConfig, stage: int, p: int, chunks: int = 1,
                 boundaries: list[int] | None = None) -> list[StageModule]:
    """This rank's chunks: virtual stages stage, stage + p, … of the full model (same init everywhere)."""
    model = TinyGPT(cfg.model, init_seed=cfg.seed)
    ranges = split_layers(model, p * chunks, boundaries)
    last = p * chunks - 1
    return [StageModule(model, *ranges[c * p + stage], first=c * p + stage == 0, last=c * p + stage == last)
            for c in range(chunks)]


class PipelineParallel(Strategy):
    """dp = tp = 1: rank s is pipeline stage s; every rank gets the global batch from the loop, the first
    stage reads x, the last y."""

    schedule_name: ClassVar[str]
    chunks_per_rank: ClassVar[int] = 1

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        return 1, 1, check_pipeline(cfg, cls.name, cls.chunks_per_rank)

    def __init__(self, ctx, cfg, boundaries: list[int] | None = None):
        super().__init__(ctx, cfg)
        p, v, m = self.pp, self.chunks_per_rank, cfg.microbatches
        self.chunks = [c.to(ctx.device) for c in build_stages(cfg, ctx.rank, p, v, boundaries)]
        self.model = nn.ModuleList(self.chunks)
        self.optimizer = self.new_optimizer(self.model.parameters())
        self.schedule = build_schedule(self.schedule_name, p, m, v)
        mb = 1 if self.schedule.batch_scale > 1 else m
        shape = (cfg.global_batch // mb, cfg.model.seq_len, cfg.model.n_embd)  # (B/m, T, H) at every boundary
        agree_on_shapes({"shape": shape, "layers": [c.layers for c in self.chunks]})
        self.executor = PipelineExecutor(self.schedule, self.chunks, ctx.rank, list(range(p)),
                                         Mailbox(shape, mb, p * v, device=ctx.device))

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        result = self.executor.step(x.to(self.ctx.device), y.to(self.ctx.device))
        self.optimizer.step()
        return result


@register("pp-naive")
class NaivePipeline(PipelineParallel):
    """Naive model parallelism: the whole batch through the stages one after the other."""
    schedule_name = "naive"


@register("pp-gpipe")
class GPipe(PipelineParallel):
    """All forwards, then all backwards (Huang et al. 2019)."""
    schedule_name = "gpipe"


@register("pp-1f1b")
class OneFOneB(PipelineParallel):
    """One forward, one backward after a p − s − 1 warm-up (PipeDream-Flush)."""
    schedule_name = "1f1b"


@register("pp-interleaved")
class Interleaved(PipelineParallel):
    """1F1B over 2 chunks per rank (Megatron-LM's interleaved schedule)."""
    schedule_name = "interleaved"
    chunks_per_rank = 2
