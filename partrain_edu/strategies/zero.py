"""ZeRO-1 and ZeRO-2 on TinyGPT: a full replica per rank, `ZeroOptimizer` sharding what AdamW keeps.

    partrain-edu train --strategy zero1 --nproc 4 --steps 20 --json
    partrain-edu train --strategy zero2 --nproc 4 --microbatches 2 --steps 20 --json

The step is the data-parallel one (this rank's slice, micro-batches, one `optimizer.step()`): the optimizer
reduce-scatters the gradients, updates this rank's chunk and all-gathers it, 2(n−1)/n·Ψ·4 bytes per step (ZeRO-2
once per micro-batch's backward). Held per rank, fp32 + AdamW: params 4Ψ; grads 4Ψ (zero1) or 4⌈Ψ/n⌉ (zero2);
optimizer 8⌈Ψ/n⌉ plus one 4-byte `step` per parameter piece (`theory.memory` leaves those out).
"""
from __future__ import annotations

from typing import ClassVar

import torch

from partrain_edu.parallel.zero import ZeroOptimizer
from partrain_edu.strategies.base import LEARNING_RATE, Strategy, optimizer_state_tensors, register


class _ZeroDataParallel(Strategy):
    stage: ClassVar[int]

    def __init__(self, ctx, cfg, optimizer_class=torch.optim.AdamW, **optimizer_kwargs):
        super().__init__(ctx, cfg)
        self.model = self.new_model()
        self.optimizer = ZeroOptimizer(self.model.parameters(), optimizer_class, stage=self.stage,
                                       **({"lr": LEARNING_RATE} | optimizer_kwargs))

    def state_tensors(self):
        grads = self.optimizer.gradient_shards() if self.stage == 2 else \
            [p.grad for p in self.model.parameters() if p.grad is not None]
        return {"params": list(self.model.parameters()), "grads": grads,
                "optimizer": optimizer_state_tensors(self.optimizer)}


@register("zero1")
class Zero1(_ZeroDataParallel):
    stage = 1


@register("zero2")
class Zero2(_ZeroDataParallel):
    stage = 2
