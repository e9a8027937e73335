"""`torch-pp`, `torch-pp-zb`: PyTorch's own pipeline parallelism — `torch.distributed.pipelining`'s
`Schedule1F1B`, and its zero-bubble `ScheduleInterleavedZeroBubble` (Qi et al. 2024) on one stage per rank.

    partrain-edu train --strategy torch-pp --nproc 4 --pp 4 --microbatches 8 --json
    partrain-edu train --strategy torch-pp-zb --nproc 4 --pp 4 --microbatches 8 --json

Sharded: the same stages as `pp-1f1b` (strategies/pipeline.py's `build_stages`), each wrapped in a
`PipelineStage`. `Schedule1F1B` cuts the batch into m micro-batches, runs warm-up forwards /
one-forward-one-backward / cool-down (PipeDream-Flush, Narayanan et al. 2021 §2.2.1), computes `loss_fn` on
the last stage and, with `scale_grads=True`, divides the gradients by m — the same sum of (loss_mb / m)' as
`single`. Sent: the same (B/m, T, H) fp32 activations forward and gradients back, 2m messages of
(B/m)·T·H·4 bytes per middle stage and step. Each stage is given its input and output shapes up front (measured
once by `parallel.pipeline.infer_boundaries`), so PyTorch sends no shape-inference messages; it sends through
`dist.isend`/`dist.irecv`, so `CommTracer` sees them. torch-pp-zb splits each backward into I (input gradient)
and W (weights'): ZB-H1's order on one stage per rank. ZBVZeroBubble and DualPipeV need two stages per rank in a V.
"""
from __future__ import annotations

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleavedZeroBubble

from partrain_edu.config import TrainConfig
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.pipeline import infer_boundaries
from partrain_edu.strategies.base import Strategy, register
from partrain_edu.strategies.pipeline import build_stages, check_pipeline


@register("torch-pp")
class TorchPipeline(Strategy):
    """dp = tp = 1: rank s is `PipelineStage` s of `Schedule1F1B`."""

    def schedule(self, stage: PipelineStage, m: int):
        return Schedule1F1B(stage, m, loss_fn=TinyGPT.loss, scale_grads=True)

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        return 1, 1, check_pipeline(cfg, cls.name)

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        p = self.pp
        m = cfg.microbatches
        c = cfg.model
        (chunk,) = build_stages(cfg, ctx.rank, p)
        self.model = chunk.to(ctx.device)
        self.optimizer = self.new_optimizer(self.model.parameters())
        b, s = cfg.global_batch // m, ctx.rank
        tokens = torch.zeros(b, c.seq_len, dtype=torch.long, device=ctx.device)    # (B/m, T)
        act = [torch.empty(shape, dtype=dtype, device=ctx.device, requires_grad=True)  # (B/m, T, H) each
               for shape, dtype in infer_boundaries([self.model], s, list(range(p)), tokens)]
        logits = torch.empty(b, c.seq_len, c.vocab_size, device=ctx.device)        # (B/m, T, V)
        self.stage = PipelineStage(self.model, s, p, ctx.device, input_args=tokens if s == 0 else act[s - 1],
                                   output_args=logits if s == p - 1 else act[s])
        self.pipe = self.schedule(self.stage, m)

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        x, y = x.to(self.ctx.device), y.to(self.ctx.device)
        losses: list[torch.Tensor] = []
        if self.stage.is_first:
            self.pipe.step(x, target=y if self.stage.is_last else None, losses=losses)
        else:
            self.pipe.step(target=y if self.stage.is_last else None, losses=losses)
        self.optimizer.step()
        if not self.stage.is_last:
            return 0.0, 0
        per_mb = x.size(0) // self.cfg.microbatches
        return sum(loss.item() for loss in losses) * per_mb, x.size(0)


@register("torch-pp-zb")
class TorchZeroBubble(TorchPipeline):
    """The same stages under `ScheduleInterleavedZeroBubble` (a list of this rank's one stage): B split in I and W."""

    def schedule(self, stage: PipelineStage, m: int):
        return ScheduleInterleavedZeroBubble([stage], m, loss_fn=TinyGPT.loss, scale_grads=True)
