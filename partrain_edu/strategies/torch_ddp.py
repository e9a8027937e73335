"""`torch-ddp`: PyTorch's own `torch.nn.parallel.DistributedDataParallel`, run through our loop beside `ddp`.

    partrain-edu train --strategy torch-ddp --nproc 2 --steps 20 --json

Sharded: nothing; every rank holds the full model, gradients and AdamW states (Li et al. 2020, "PyTorch
Distributed"). Sent: one all-reduce of every gradient per step, in buckets overlapped with backward; each rank
sends 2(n−1)/n · Ψ · 4 bytes (fp32, ring all-reduce) — the same as `ddp`.
"""
from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from partrain_edu.comm.ddp_hook import traced_allreduce_hook
from partrain_edu.strategies.base import Strategy, register


@register("torch-ddp")
class TorchDDP(Strategy):
    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters at construction; our init is identical everywhere anyway.
        self.model = DistributedDataParallel(self.new_model(), device_ids=device_ids)
        # DDP's reducer calls the collective from C++, where `CommTracer` (which watches torch.distributed's
        # Python functions) cannot see it. This hook does exactly what DDP's default does — all-reduce the
        # bucket, divide by the world size — but through `dist.all_reduce`, so the real traffic is counted.
        self.model.register_comm_hook(state=None, hook=traced_allreduce_hook)
        self.optimizer = self.new_optimizer(self.model.parameters())
