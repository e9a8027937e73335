"""`ddp` and `ddp-naive`: a full TinyGPT replica per rank, this rank's slice of the batch, gradients averaged.

    partrain-edu train --strategy ddp --nproc 4 --steps 20 --json
    partrain-edu train --strategy ddp-naive --nproc 4 --steps 20 --json     (per parameter, after backward)

Sharded: nothing but the batch — global batch = per-rank batch × ranks. Sent: rank 0's parameters once
(broadcast), then every step an all-reduce of every gradient, averaged over the n ranks:

    θ(t+1) = θ(t) − η · (1/n) Σᵢ ∇L(xᵢ, yᵢ; θ(t))     each rank sends 2(n−1)/n · Ψ · 4 bytes (ring, fp32)

`ddp` wraps the model in `parallel.ddp.DistributedDataParallel` (buckets that leave while backward goes on);
`ddp-naive` keeps it bare and calls `parallel.ddp.allreduce_per_parameter` after backward: the same bytes,
one call per parameter, no overlap.
"""
from __future__ import annotations

from partrain_edu.parallel.ddp import (
    DEFAULT_BUCKET_CAP_BYTES,
    DistributedDataParallel,
    allreduce_per_parameter,
    broadcast_parameters,
)
from partrain_edu.strategies.base import Strategy, register


@register("ddp")
class DDP(Strategy):
    def __init__(self, ctx, cfg, bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                 find_unused_parameters: bool = False):
        super().__init__(ctx, cfg)
        # The wrapper's hooks all-reduce during backward; `Strategy.train_step` uses its `no_sync`.
        self.model = DistributedDataParallel(self.new_model(), bucket_cap_bytes=bucket_cap_bytes,
                                             find_unused_parameters=find_unused_parameters)
        self.optimizer = self.new_optimizer(self.model.parameters())


@register("ddp-naive")
class NaiveDDP(Strategy):
    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.model = self.new_model()
        broadcast_parameters(self.model)
        self.optimizer = self.new_optimizer(self.model.parameters())

    def sync_after_backward(self) -> None:
        allreduce_per_parameter(self.model.parameters())
