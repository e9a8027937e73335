"""`zero3`: TinyGPT under our `FullyShardedDataParallel` (ZeRO-3), one unit per transformer block plus the root.

    partrain-edu train --strategy zero3 --nproc 2 --steps 20 --json
    partrain-edu train --strategy zero3 --nproc 4 --microbatches 2 --steps 20 --json

Rajbhandari et al. 2020 ("ZeRO", §5.3) and Zhao et al. 2023 ("PyTorch FSDP", §3): units = each block of
`model.blocks`, and the root (embeddings, final layernorm, head), gathered through the whole forward. Held per
rank, fp32 + AdamW: params 4⌈Ψ/n⌉, grads 4⌈Ψ/n⌉, optimizer 8⌈Ψ/n⌉ plus one 4-byte `step` per parameter piece
(69 per rank: AdamW sees TinyGPT's parameters, each as this rank's piece; `theory.memory` leaves them out),
plus the transient gathered units (`peak_gathered_bytes`: the root and one block, two with prefetch). Sent per
unit and micro-batch: all-gather for forward, all-gather for backward, reduce-scatter of the gradient —
3·(n−1)/n·Ψ·4 bytes = 1.5× DDP's. The step is the data-parallel one: the communication lives in the model.
"""
from __future__ import annotations

from partrain_edu.parallel.fsdp import FullyShardedDataParallel, MixedPrecision
from partrain_edu.strategies.base import Strategy, optimizer_state_tensors, register


@register("zero3")
class Zero3(Strategy):
    def __init__(self, ctx, cfg, group=None, prefetch: bool = False, mixed_precision: MixedPrecision | None = None):
        super().__init__(ctx, cfg)
        model = self.new_model()
        self.model = FullyShardedDataParallel(model, group, units=list(model.blocks), prefetch=prefetch,
                                              mixed_precision=mixed_precision)   # zero3-bf16: bf16 on the wire
        self.optimizer = self.new_optimizer(self.model.parameters())

    def state_tensors(self):
        pieces = list(self.model.parameters())
        return {"params": [flat.data for flat in self.model.flat_shards()],   # the chunks, padding included
                "grads": [p.grad for p in pieces if p.grad is not None],
                "optimizer": optimizer_state_tensors(self.optimizer)}
