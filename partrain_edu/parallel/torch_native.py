"""PyTorch's own implementations, run through the same loop as ours so the two can be compared line by line.

torch-ddp — `torch.nn.parallel.DistributedDataParallel` (Li et al. 2020, "PyTorch Distributed").
    Sharded: nothing; every rank holds the full model, gradients and AdamW states.
    Communicated: one all-reduce of every gradient per step, in buckets overlapped with backward;
    each rank sends 2(n−1)/n · Ψ · 4 bytes (fp32, ring all-reduce).
    Run:  partrain-edu train --strategy torch-ddp --nproc 2 --steps 20 --json

DDP's reducer calls the collective from C++, where `CommTracer` (which watches `torch.distributed`'s Python
functions) cannot see it. We register a communication hook that does exactly what DDP's default does —
all-reduce the bucket, divide by the world size — but through `torch.distributed.all_reduce`, so the tracer
counts the real traffic. The numbers are unchanged: it is the same collective on the same buffer.
"""
from __future__ import annotations

from torch.nn.parallel import DistributedDataParallel

from partrain_edu.comm_adapters import traced_allreduce_hook
from partrain_edu.train import Strategy, register


@register("torch-ddp")
class TorchDDP(Strategy):
    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # DDP broadcasts rank 0's parameters at construction; our init is identical everywhere anyway.
        self.model = DistributedDataParallel(self.new_model(), device_ids=device_ids)
        self.model.register_comm_hook(state=None, hook=traced_allreduce_hook)
        self.optimizer = self.new_optimizer(self.model.parameters())
