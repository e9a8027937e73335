"""`pp-naive`, `pp-gpipe`, `pp-1f1b`, `pp-interleaved`, `pp-zb1`: TinyGPT cut into stages, run by our executor.

    partrain-edu train --strategy pp-1f1b --nproc 4 --pp 4 --microbatches 8 --json
    partrain-edu train --strategy pp-zb1 --nproc 4 --pp 4 --microbatches 8 --device emulated:a100 --json
    partrain-edu train --strategy pp-interleaved --nproc 2 --microbatches 4 --json   # 2 chunks per rank

Sharded: TinyGPT's blocks (`parallel.pipeline.split_layers` balances parameter counts, the embedding counted with
the first stage and ln_f + head with the last; `parallel.pipeline.Stage` holds a run of them); with interleaving
each rank holds 2 chunks, virtual stage v = chunk·p + s. Sent per micro-batch and boundary: the (B/m, T, H)
activation forward and its gradient back (`parallel.pp_comm.Mailbox`, its shapes measured once by
`infer_boundaries`), a middle stage 2m messages of (B/m)·T·H·4 bytes per step. The order of work is
`theory.schedules.build_schedule(...)`'s, executed literally by `parallel.pipeline.PipelineExecutor`; its waits
are the bubble, (p−1)/(m+p−1) for GPipe and 1F1B, (p−1)(F+B−W)/(m(F+B+W)+(p−1)(F+B−W)) for ZB-H1 (Qi et al.
2023; B the input gradient, W the weights'). dp = tp = 1; `profile_step` measures one step's timeline.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.config import TrainConfig
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.pipeline import (
    PipelineExecutor,
    Stage,
    gather_timeline,
    infer_boundaries,
    measured_bubble,
    split_layers,
)
from partrain_edu.parallel.pp_comm import Mailbox
from partrain_edu.strategies.base import Strategy, get_strategy, register
from partrain_edu.strategies.emulation import emulate
from partrain_edu.theory.schedules import bubble_formula, build_schedule, simulate
from partrain_edu.train_checks import check_pipeline  # noqa: F401  (torch-free: shared with the CLI's early check)


class TokensAndPositions(nn.Module):
    """What TinyGPT runs before its blocks: token ids (B, T) → token + position embeddings (B, T, H)."""

    def __init__(self, model: TinyGPT):
        super().__init__()
        self.wte, self.wpe = model.wte, model.wpe

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))


def tinygpt_ends(model: TinyGPT) -> tuple[nn.Module, nn.Module]:
    """TinyGPT around its blocks: the embeddings before them (first stage), ln_f + head after (last stage)."""
    return TokensAndPositions(model), nn.Sequential(OrderedDict(ln_f=model.ln_f, head=model.head))


def split_tinygpt(model: TinyGPT, parts: int, boundaries: list[int] | None = None) -> list[tuple[int, int]]:
    """Block ranges [lo, hi) for `parts` (virtual) stages, the embeddings weighed with the first, the head with
    the last (`split_layers`)."""
    return split_layers(model.blocks, parts, boundaries, *tinygpt_ends(model))


def tinygpt_stage(model: TinyGPT, lo: int, hi: int, first: bool, last: bool) -> Stage:
    """Blocks [lo, hi), with the embeddings if first and ln_f + head if last: tokens (B, T) or activations
    (B, T, H) → activations (B, T, H), or logits (B, T, V) on the last stage."""
    pre, post = tinygpt_ends(model)
    return Stage(model.blocks, lo, hi, pre if first else None, post if last else None)


def build_stages(cfg: TrainConfig, stage: int, p: int, chunks: int = 1,
                 boundaries: list[int] | None = None) -> list[Stage]:
    """This rank's chunks: virtual stages stage, stage + p, … of the full model (same init everywhere)."""
    model = TinyGPT(cfg.model, init_seed=cfg.seed)
    ranges = split_tinygpt(model, p * chunks, boundaries)
    last = p * chunks - 1
    return [tinygpt_stage(model, *ranges[c * p + stage], first=c * p + stage == 0, last=c * p + stage == last)
            for c in range(chunks)]


class PipelineParallel(Strategy):
    """dp = tp = 1: rank s is pipeline stage s; every rank gets the global batch from the loop, the first
    stage reads x, the last y."""

    schedule_name: ClassVar[str]
    chunks_per_rank: ClassVar[int] = 1
    # The simulator's F, B, W per micro-batch and stage, in forwards, as the emulated device charges them: a
    # backward is two matrix products per forward one (input and weight gradients), run as one B unless split.
    costs: ClassVar[tuple[int, int, int]] = (1, 2, 0)

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        return 1, 1, check_pipeline(cfg, cls.name, cls.chunks_per_rank)

    def __init__(self, ctx, cfg, boundaries: list[int] | None = None):
        super().__init__(ctx, cfg)
        p = self.pp
        v = self.chunks_per_rank
        m = cfg.microbatches
        self.chunks = [c.to(ctx.device) for c in build_stages(cfg, ctx.rank, p, v, boundaries)]
        self.model = nn.ModuleList(self.chunks)
        self.optimizer = self.new_optimizer(self.model.parameters())
        self.schedule = build_schedule(self.schedule_name, p, m, v)
        mb = 1 if self.schedule.batch_scale > 1 else m
        tokens = torch.zeros(cfg.global_batch // mb, cfg.model.seq_len, dtype=torch.long, device=ctx.device)
        shapes = infer_boundaries(self.chunks, ctx.rank, list(range(p)), tokens)  # (B/m, T, H) at every boundary
        self.executor = PipelineExecutor(self.schedule, self.chunks, ctx.rank, list(range(p)),
                                         Mailbox(shapes, mb, device=ctx.device), TinyGPT.loss)

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        result = self.executor.step(x.to(self.ctx.device), y.to(self.ctx.device))
        self.optimizer.step()
        return result

    def timing(self) -> dict:
        """On the emulated device, the last step's measured bubble beside the formula's (every rank calls it).
        On a real CPU the bubble measures contention for cores, not the schedule: nothing is reported."""
        if self.ctx.emulator is None:
            return {}
        events = gather_timeline(self.executor.events)
        text, value = bubble_formula(self.schedule_name, self.pp, self.cfg.microbatches, self.chunks_per_rank,
                                     *self.costs) or ("simulated", simulate(self.schedule, *self.costs).bubble_fraction)
        return {"bubble": {"measured": measured_bubble(events, self.pp), "formula": float(value),
                           "formula_text": text}}


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


@register("pp-zb1")
class ZeroBubbleH1(PipelineParallel):
    """1F1B with B (input gradient) and W (weight gradient) apart, W's late to fill the cool-down (ZB-H1)."""
    schedule_name = "zb-h1"
    costs = (1, 1, 1)


def profile_step(ctx, cfg: TrainConfig, boundaries: list[int] | None = None, warmup: int = 1) -> dict:
    """Run `cfg.strategy` (a pp-* strategy) for `warmup` steps, then one more that is measured; every rank
    returns {"events": all ranks' events (s from the first start), "peaks": per stage, "bubble": measured}."""
    if not issubclass(get_strategy(cfg.strategy), PipelineParallel):
        raise ValueError(f"profile_step runs our executor: pick pp-naive, pp-gpipe, pp-1f1b, pp-interleaved or "
                         f"pp-zb1, not {cfg.strategy}")
    strategy = get_strategy(cfg.strategy)(ctx, cfg, boundaries=boundaries)
    if ctx.emulator is not None:
        emulate(strategy)
    data = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=cfg.seed)
    for step in range(warmup + 1):
        dist.barrier()  # start each step together, so the first stage's lead is not counted as bubble
        strategy.train_step(*data.global_batch(step, cfg.global_batch))
    events = gather_timeline(strategy.executor.events)
    peaks: list[int] = [0] * ctx.world_size
    dist.all_gather_object(peaks, strategy.executor.peak)
    return {"events": events, "peaks": peaks, "bubble": measured_bubble(events, strategy.pp)}
