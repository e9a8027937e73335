"""PyTorch's own pipeline parallelism — `torch.distributed.pipelining` with `Schedule1F1B` — beside ours.

    partrain-edu train --strategy torch-pp --nproc 4 --pp 4 --microbatches 8 --json

**Sharded**: the same stages as `pp-1f1b` (pipeline.py's `build_stages`: balanced by parameter count, the
embedding on the first stage, ln_f + head on the last), each wrapped in a `PipelineStage`. `Schedule1F1B`
cuts the batch into m micro-batches itself, runs warm-up forwards / one-forward-one-backward / cool-down
(PipeDream-Flush, Narayanan et al. 2021 §2.2.1), computes `loss_fn` on the last stage and, with
`scale_grads=True`, divides the gradients by m — the same sum of (loss_mb / m)' as `single`.

**Communicated**: the same (B/m, T, H) fp32 activations forward and gradients back. We give each stage its
input and output shapes up front (`input_args`/`output_args`), so no shape-inference messages are sent.
PyTorch sends through `dist.isend`/`dist.irecv` (or `batch_isend_irecv` when a batch mixes both), which it
looks up on the `torch.distributed` module each step — so `CommTracer` sees them, and `comm` reports them
in the same {op: {calls, bytes}} shape as for `pp-1f1b` (split into isend/irecv records; ours are isend too).
"""
from __future__ import annotations

import torch
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from partrain_edu.models import TinyGPT
from partrain_edu.parallel.pipeline import build_stages, check_pipeline
from partrain_edu.train import Strategy, TrainConfig, register


@register("torch-pp")
class TorchPipeline(Strategy):
    """dp = tp = 1: rank s is `PipelineStage` s of `Schedule1F1B`."""

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        return 1, 1, check_pipeline(cfg, cls.name)

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        p, m, c = self.pp, cfg.microbatches, cfg.model
        (chunk,) = build_stages(cfg, ctx.rank, p)
        self.model = chunk.to(ctx.device)
        self.optimizer = self.new_optimizer(self.model.parameters())
        b = cfg.global_batch // m
        act = torch.empty(b, c.seq_len, c.n_embd, device=ctx.device, requires_grad=True)  # (B/m, T, H)
        tokens = torch.zeros(b, c.seq_len, dtype=torch.long, device=ctx.device)    # (B/m, T)
        logits = torch.empty(b, c.seq_len, c.vocab_size, device=ctx.device)        # (B/m, T, V)
        self.stage = PipelineStage(self.model, ctx.rank, p, ctx.device,
                                   input_args=tokens if chunk.first else act,
                                   output_args=logits if chunk.last else act)
        self.pipe = Schedule1F1B(self.stage, m, loss_fn=TinyGPT.loss, scale_grads=True)

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
