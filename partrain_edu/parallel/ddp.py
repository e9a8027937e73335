"""DDP from scratch: full replicas, gradients averaged by a bucketed all-reduce that overlaps backward.

    partrain-edu train --strategy ddp --nproc 4 --steps 20 --json
    partrain-edu train --strategy ddp-naive --nproc 4 --steps 20 --json     (per parameter, after backward)

Sharded: nothing (数据并行 / 全量副本) — every rank holds the whole model, its gradients and AdamW states;
only the batch is split: global batch = per-rank batch × ranks.
Communicated: at start, rank 0's parameters are broadcast (every replica starts equal). Every step, one
all-reduce of every gradient, averaged by the world size, so each replica takes the same step as one process
on the whole batch (the source notes' equation):

    θ(t+1) = θ(t) − η · (1/N) Σᵢ ∇L(xᵢ, yᵢ; θ(t))

Ring all-reduce: each rank sends 2(n−1)/n · Ψ · 4 bytes per step (fp32) — `theory.traffic` for `ddp`.

How (Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", §3.2):
gradients are grouped into buckets in reverse registration order (`buckets.plan_buckets`); a
post-accumulate-grad hook launches an async all-reduce as soon as a bucket is full, so communication overlaps
the rest of backward; the end of backward waits for all of them. `no_sync()` skips communication while
micro-batches accumulate gradients. A parameter without a gradient is refused, as PyTorch's DDP does, unless
`find_unused_parameters=True`: then it contributes zeros, and one more all-reduce of a used-flag per parameter
finds those no rank used, whose gradient stays None, exactly as in one process. Every bucket's all-reduce start
and finish, relative to the start of backward, is kept in `timeline` for the overlap picture.

Mixed precision (`mixed_precision=MixedPrecision(torch.bfloat16)`, the `ddp-bf16` strategy): forward runs
through a bf16 copy of the fp32 parameters (`mixed_precision.LowPrecisionCopy`), the fp32 gradients sum in
`.grad` and travel in bf16 buckets: 2(n−1)/n · Ψ · 2 bytes, half of fp32's.

`allreduce_per_parameter` is the textbook version beside it (the `ddp-naive` strategy): after backward has
ended, one blocking all-reduce per parameter — the same bytes, many more calls, no overlap. Both wrap any
module; `strategies/ddp.py` applies them to TinyGPT.
"""
from __future__ import annotations

import collections
import contextlib
import time
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.parallel.buckets import Bucket, GradBucketHooks, allreduce_mean, plan_buckets
from partrain_edu.parallel.mixed_precision import LowPrecisionCopy, MixedPrecision, cast_floating

# PyTorch DDP's default cap (`bucket_cap_mb=25`): `ddp` and `torch-ddp` run alike. TinyGPT's 0.87 MB of fp32
# gradients then fit in ONE bucket — nothing to overlap; pass a smaller cap (notebook 02 uses 256 KiB) to
# see buckets leave while backward goes on.
DEFAULT_BUCKET_CAP_BYTES = 25 * 1024 * 1024
TIMELINE_STEPS = 64


def broadcast_tensors(tensors: Iterable[torch.Tensor], group=None) -> None:
    """Copy group rank 0's values into every rank's tensors: the replicas start from the same point."""
    src = dist.get_global_rank(group if group is not None else dist.group.WORLD, 0)
    with torch.no_grad():
        for tensor in tensors:
            dist.broadcast(tensor, src=src, group=group)


def broadcast_parameters(module: nn.Module, group=None) -> None:
    """Rank 0's parameters and buffers on every rank of `group`."""
    broadcast_tensors([*module.parameters(), *module.buffers()], group)


class DistributedDataParallel(nn.Module):
    """Wrap `module`: forward is the module's; backward also averages the gradients over `group`."""

    def __init__(self, module: nn.Module, group=None, bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES,
                 find_unused_parameters: bool = False, clock=time.perf_counter,
                 mixed_precision: MixedPrecision | None = None):
        super().__init__()
        self.module, self.group = module, group
        self.mixed_precision = mixed_precision or MixedPrecision()
        self.clock = clock               # what the timeline is timed with: wall time, or an emulated device's
        self.world_size = dist.get_world_size(group)
        self.find_unused_parameters = find_unused_parameters
        broadcast_parameters(module, group)
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = plan_buckets(self.params, bucket_cap_bytes, self.mixed_precision.wire_dtype)
        # The bf16 compute copy (None: compute in the parameters' own dtypes). Built after the broadcast.
        self.compute = LowPrecisionCopy(module, self.mixed_precision) if self.mixed_precision.param_dtype else None
        self.hooks = GradBucketHooks(self.buckets, launch=self._launch, finish=self._finish)
        self._pending: list[tuple[Bucket, torch.futures.Future]] = []
        self._step: dict = {}
        # One entry per synchronised backward (see `_finish`), the last TIMELINE_STEPS of them: a long run
        # must not grow it without bound.
        self.timeline: collections.deque[dict] = collections.deque(maxlen=TIMELINE_STEPS)
        self._names = {id(p): name for name, p in module.named_parameters()}

    def forward(self, *args, **kwargs):
        if self.compute is not None:
            out = self.compute(*args, **kwargs)
        else:
            out = cast_floating(self.module(*args, **kwargs), self.mixed_precision.output_dtype)
        if self.hooks.enabled and isinstance(out, torch.Tensor) and out.requires_grad:
            # The output's gradient is the first thing backward computes (after the loss): mark the start.
            out.register_hook(self._backward_started)
        return out

    def _backward_started(self, grad: torch.Tensor) -> None:
        self._step = {"backward_start": self.clock(), "buckets": []}

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) for the backwards run inside."""
        self.hooks.enabled = False
        try:
            yield
        finally:
            self.hooks.enabled = True

    def _launch(self, bucket: Bucket) -> None:
        """A full bucket: average its gradients over the ranks without waiting (backward goes on)."""
        record = {"bucket": bucket.index, "bytes": bucket.nbytes, "params": len(bucket.params),
                  "launched": self.clock()}
        self._step.setdefault("buckets", []).append(record)
        work = allreduce_mean(bucket, self.group, self.world_size, async_op=True)   # unpacked in `_finish`
        # Runs when the all-reduce has completed (on Gloo's thread): the finish time of the overlap picture.
        done = work.get_future().then(lambda fut: record.update(finished=self.clock()))
        self._pending.append((bucket, done))

    def _finish(self) -> None:
        """End of backward: wait for every bucket, write the averaged gradients back."""
        compute_end = self.clock()
        used = [p.grad is not None for p in self.params]
        for bucket, done in self._pending:
            done.wait()
            bucket.unpack()
        self._pending = []
        if not self.find_unused_parameters and not all(used):
            # PyTorch's DDP refuses this too: averaging a zero for it would move it (momentum, weight decay)
            # where one process would leave it alone.
            missing = [self._names[id(p)] for p, u in zip(self.params, used, strict=True) if not u]
            raise RuntimeError(f"parameters {missing} got no gradient in this backward: pass "
                               "find_unused_parameters=True, or freeze them (requires_grad=False)")
        if self.find_unused_parameters:
            counts = torch.tensor(used, dtype=torch.int32, device=self.params[0].device)  # NCCL: GPU tensors only
            dist.all_reduce(counts, group=self.group)        # how many ranks gave each parameter a gradient
            for p, count in zip(self.params, counts.tolist(), strict=True):
                if count == 0:
                    p.grad = None                            # no rank used it: as in one process, no gradient
        step, self._step = self._step, {}
        start = step.get("backward_start", compute_end)
        self.timeline.append({
            "compute_end": compute_end - start, "synced": self.clock() - start,
            "buckets": [{**b, "launched": b["launched"] - start, "finished": b["finished"] - start}
                        for b in step.get("buckets", [])]})


def allreduce_per_parameter(params: Iterable[nn.Parameter], group=None) -> None:
    """The naive synchronisation: after backward, one blocking all-reduce per gradient, then average."""
    world_size = dist.get_world_size(group)
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(world_size)
