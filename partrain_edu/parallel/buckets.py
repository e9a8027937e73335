"""Gradient buckets, and the hooks that hand a bucket to a collective the moment its last gradient exists.

The piece every data-parallel strategy shares (DDP all-reduces a full bucket; ZeRO-2 reduce-scatters it; FSDP
reduce-scatters one layer's). Two ideas from PyTorch DDP (Li et al. 2020, "PyTorch Distributed", §3.2.3):

1. **Buckets.** One collective per parameter pays the per-call latency hundreds of times; one collective for
   the whole model can only start when backward has ended. In between: parameters are packed, in *reverse*
   registration order (backward produces the last layer's gradients first), into buckets of about
   `cap_bytes`; a bucket is closed as soon as it reaches the cap (so a cap of 1 byte gives one bucket per
   parameter, a cap above the model size gives one bucket).
2. **Hooks.** `Tensor.register_post_accumulate_grad_hook` runs right after autograd has added a parameter's
   gradient into `.grad`. When every parameter of a bucket has reported, the bucket is *launched* (an async
   collective), while autograd goes on computing the earlier layers' gradients: communication overlaps the
   rest of backward. Buckets are launched strictly in bucket order, because every rank must issue its
   collectives in the same order (hooks can fire in a slightly different order on different ranks).

A parameter that gets no gradient in a backward would keep its bucket from ever filling. The first hook of a
backward therefore queues a callback on the autograd engine (`queue_callback`, as PyTorch DDP and FSDP do)
that runs once when the backward has ended: it launches the buckets still waiting, then calls `finish`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn


@dataclass(eq=False)
class Bucket:
    """Parameters whose gradients travel together, packed into one flat buffer."""

    index: int
    params: list[nn.Parameter]
    spans: list[tuple[int, int]] = field(default_factory=list)   # (start, end) of each parameter in `buffer`
    buffer: torch.Tensor | None = None                           # (numel,) gradients, flat
    dtype: torch.dtype | None = None                             # the buffer's (the wire's); None: the params'

    def __post_init__(self):
        start = 0
        for p in self.params:
            self.spans.append((start, start + p.numel()))
            start += p.numel()
        self.dtype = self.dtype or self.params[0].dtype         # another dtype: pack and unpack cast
        self.buffer = torch.zeros(start, dtype=self.dtype, device=self.params[0].device)
        self.views = [self.buffer[a:b].view_as(p) for p, (a, b) in zip(self.params, self.spans, strict=True)]

    @property
    def numel(self) -> int:
        return self.buffer.numel()

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()

    def pack(self) -> torch.Tensor:
        """Copy the gradients into the flat buffer; a parameter without a gradient contributes zeros."""
        have = [(v, p.grad) for p, v in zip(self.params, self.views, strict=True) if p.grad is not None]
        if len(have) < len(self.params):
            self.buffer.zero_()
        if have:  # one call for every copy, not one per parameter: with ranks sharing a core, Python time is step time
            torch._foreach_copy_([v for v, _ in have], [g for _, g in have])
        return self.buffer

    def unpack(self) -> None:
        """Copy the (reduced) buffer back into each parameter's `.grad`."""
        have = [(p.grad, v) for p, v in zip(self.params, self.views, strict=True) if p.grad is not None]
        if have:
            torch._foreach_copy_([g for g, _ in have], [v for _, v in have])
        for p, v in zip(self.params, self.views, strict=True):
            if p.grad is None:
                p.grad = v.to(p.dtype, copy=True)


def plan_buckets(params: Iterable[nn.Parameter], cap_bytes: int,
                 wire_dtype: Callable[[torch.dtype], torch.dtype] = lambda dtype: dtype) -> list[Bucket]:
    """Group `params` (in registration order) into buckets of about `cap_bytes`, last parameter first.
    A bucket holds one dtype on one device (one flat buffer, in `wire_dtype(that dtype)`: mixed precision
    sends fp32 gradients as bf16); it is closed once it reaches `cap_bytes`."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket_cap_bytes must be a positive number of bytes, got {cap_bytes}")
    groups: list[list[nn.Parameter]] = []
    size = 0
    for p in reversed(list(params)):
        fits = groups and size < cap_bytes and (p.dtype, p.device) == (groups[-1][0].dtype, groups[-1][0].device)
        if not fits:
            groups.append([])
            size = 0
        groups[-1].append(p)
        size += p.numel() * p.element_size()
    return [Bucket(i, ps, dtype=wire_dtype(ps[0].dtype)) for i, ps in enumerate(groups)]


def allreduce_mean(bucket: Bucket, group, size: int, async_op: bool = False):
    """Each gradient of `bucket` summed over `group` and divided by `size`: pack, divide, all-reduce, unpack.
    With `async_op` the all-reduce's work is returned and unpacking is the caller's, once it has completed
    (DDP: backward goes on meanwhile); blocking, the averages are back in `.grad` on return."""
    flat = bucket.pack()                 # (bucket numel,) this rank's gradients
    flat.div_(size)                      # divide first, as PyTorch does: the sum cannot overflow fp16
    work = dist.all_reduce(flat, group=group, async_op=async_op)   # through dist: CommTracer sees it
    if not async_op:
        bucket.unpack()
    return work


class OncePerBackward:
    """Calls `fn` once, when the backward now running has ended: `arm()` it from any hook inside a backward
    (arming it again in the same backward does nothing). Autograd's `queue_callback`, as PyTorch's DDP reducer
    uses it; DDP's buckets, ZeRO-2's reduce-scatter and FSDP's clean-up all run through it."""

    def __init__(self, fn: Callable[[], None]):
        self.fn, self.armed = fn, False

    def arm(self) -> None:
        if not self.armed:
            self.armed = True
            torch.autograd.Variable._execution_engine.queue_callback(self._run)

    def _run(self) -> None:
        self.armed = False
        self.fn()


class GradBucketHooks:
    """Calls `launch(bucket)` for each bucket, in bucket order, as soon as all its parameters' gradients are
    accumulated in the current backward; at the end of that backward launches the rest and calls `finish()`.
    While `enabled` is False (gradient accumulation without sync) the hooks do nothing."""

    def __init__(self, buckets: list[Bucket], launch: Callable[[Bucket], None], finish: Callable[[], None]):
        self.buckets = buckets
        self.launch = launch
        self.finish = finish
        self.enabled = True
        self._bucket_of = {id(p): b for b in buckets for p in b.params}   # by identity: tensors compare by value
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for b in buckets for p in b.params]
        self._end = OncePerBackward(self._on_backward_end)
        self._reset()

    def _reset(self) -> None:
        self._ready: dict[int, set] = {b.index: set() for b in self.buckets}   # bucket -> ids of ready params
        self._next = 0                                                          # next bucket to launch

    def _on_grad(self, param: nn.Parameter) -> None:
        if not self.enabled:
            return
        self._end.arm()                 # the first gradient of this backward: be called when it ends
        bucket = self._bucket_of[id(param)]
        self._ready[bucket.index].add(id(param))
        self._launch_ready()

    def _launch_ready(self, everything: bool = False) -> None:
        """Launch buckets in order while the next one is full (or all of them, at the end of backward)."""
        while self._next < len(self.buckets):
            bucket = self.buckets[self._next]
            if not everything and len(self._ready[bucket.index]) < len(bucket.params):
                return                  # a later bucket may be full already; it waits for this one
            self._next += 1
            self.launch(bucket)

    def _on_backward_end(self) -> None:
        try:
            self._launch_ready(everything=True)   # buckets with parameters that got no gradient
            self.finish()
        finally:
            self._reset()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
