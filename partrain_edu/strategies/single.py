"""`single`: the reference every other strategy must reproduce — one process, the whole global batch.

    partrain-edu train --strategy single --steps 20 --json

Sharded: nothing. Communicated: nothing. Plain autograd and AdamW on TinyGPT; with `--microbatches M` the
gradients of M micro-batches are summed with weight 1/M, which equals one step on the whole batch.
"""
from __future__ import annotations

from partrain_edu.strategies.base import Strategy, register


@register("single")
class Single(Strategy):
    """The reference: one process, the whole global batch, plain autograd and AdamW."""

    @classmethod
    def layout(cls, cfg) -> tuple[int, int, int]:
        if cfg.nproc != 1 or (cfg.dp or 1) != 1 or (cfg.tp or 1) != 1 or (cfg.pp or 1) != 1:
            raise ValueError("single runs on one process: drop --nproc/--dp/--tp/--pp, or pick a parallel strategy")
        return super().layout(cfg)

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.model = self.new_model()
        self.optimizer = self.new_optimizer(self.model.parameters())
