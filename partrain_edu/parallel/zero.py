"""ZeRO-1 and ZeRO-2 from scratch: optimizer states (and gradients) sharded over the data-parallel ranks.

    partrain-edu train --strategy zero1 --nproc 4 --steps 20 --json
    partrain-edu train --strategy zero2 --nproc 4 --steps 20 --json

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (零冗余优化器).
DDP keeps the same optimizer states on every rank: redundant. ZeRO gives each of the n ranks one contiguous
1/n of the model's parameters, flattened into one buffer and padded to a multiple of n (⌈Ψ/n⌉ per rank, as
DeepSpeed and FSDP pad), and only that rank updates it.

Sharded (per rank, Ψ parameters, fp32 + AdamW: 4 + 4 + 8 bytes per parameter, `theory.memory`):
    zero1 (P_os)      params 4Ψ   grads 4Ψ        optimizer 8⌈Ψ/n⌉
    zero2 (P_os+g)    params 4Ψ   grads 4⌈Ψ/n⌉    optimizer 8⌈Ψ/n⌉
AdamW also keeps one 4-byte `step` scalar per parameter tensor it updates: ZeRO's optimizer sees ONE tensor
(the flat shard), so 4 bytes, where `single`'s sees 69 tensors (276 bytes). `theory.memory` leaves these out.

Communicated per step (ZeRO paper §7.2.1): the gradients are reduce-scattered (each rank receives the sum of
its own 1/n), the optimizer updates the shard, the updated shards are all-gathered into every replica:
(n−1)/n·Ψ·4 + (n−1)/n·Ψ·4 = 2(n−1)/n·Ψ·4 bytes sent — exactly DDP's all-reduce, which IS a reduce-scatter
followed by an all-gather. ZeRO-2 reduce-scatters after every micro-batch's backward and then drops the full
gradients, so only the shard's gradient stays resident (m reduce-scatters per step, `theory.traffic`). Here the
full gradients still exist while one backward runs; DeepSpeed also bounds that transient by reduce-scattering
in buckets during backward (the overlap `ddp.py` shows with `buckets.py`) — the same bytes either way.

Generic over `torch.optim`: the optimizer simply receives one parameter, this rank's flat shard. Every
optimizer whose update is elementwise (SGD, Adam, AdamW, …) then takes exactly the step it would take on the
whole model; the padding elements have zero parameters and zero gradients and stay zero.
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.data import split_microbatches
from partrain_edu.parallel.ddp import broadcast_parameters
from partrain_edu.train import Strategy, data_parallel_batch, register


class FlatShard:
    """`params` laid out in one flat fp32 buffer of `padded` = ⌈numel/n⌉·n elements; this rank owns the
    contiguous chunk [rank·s, (rank+1)·s), s = padded/n, as the nn.Parameter `shard` an optimizer can update.

    keep_full=True (ZeRO-1/2): the full buffer stays, the parameters become views into it and `shard` is a
    view of this rank's chunk — the fp32 weights are their own master copy, no byte is held twice.
    keep_full=False (ZeRO-3): only the shard stays; the caller gathers the full buffer when it needs it."""

    def __init__(self, params: Iterable[nn.Parameter], group=None, keep_full: bool = True):
        self.params, self.group = list(params), group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.spans, start = [], 0
        for p in self.params:
            self.spans.append((start, start + p.numel(), p.shape))
            start += p.numel()
        self.numel = start
        self.shard_numel = -(-start // self.world)              # s = ⌈Ψ/n⌉
        self.padded = self.shard_numel * self.world
        p0 = self.params[0]
        full = torch.zeros(self.padded, dtype=p0.dtype, device=p0.device)   # (padded,)
        with torch.no_grad():
            for p, view in zip(self.params, self.views(full)):
                view.copy_(p)
        lo = self.rank * self.shard_numel
        if keep_full:
            self.full = full
            for p, view in zip(self.params, self.views(full)):
                p.data = view                                   # the module now reads the flat buffer
            self.shard = nn.Parameter(full[lo:lo + self.shard_numel])            # (s,) a view, no copy
        else:
            self.full = None
            self.shard = nn.Parameter(full[lo:lo + self.shard_numel].clone())    # (s,) the only copy

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's place in a (padded,) buffer, shaped like the parameter."""
        return [flat[a:b].view(shape) for a, b, shape in self.spans]

    def flatten(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        """(padded,) buffer of `tensors` laid out like the parameters; None and the padding are zeros."""
        flat = torch.zeros(self.padded, dtype=self.shard.dtype, device=self.shard.device)
        for t, view in zip(tensors, self.views(flat)):
            if t is not None:
                view.copy_(t)
        return flat

    def reduce_scatter_mean(self, flat: torch.Tensor) -> torch.Tensor:
        """(s,) this rank's chunk of the mean over ranks of `flat` (padded,). Divided first, as DDP does."""
        flat.div_(self.world)
        out = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, flat, group=self.group)
        return out

    def all_gather(self, out: torch.Tensor | None = None, async_op: bool = False):
        """Every rank's shard, concatenated into `out` (padded,) (a new buffer when None)."""
        if out is None:
            out = torch.empty(self.padded, dtype=self.shard.dtype, device=self.shard.device)
        # A copy of the shard goes in: under ZeRO-1/2 the shard is a view of `out` itself, and a collective
        # whose input aliases its output is undefined on some backends.
        work = dist.all_gather_single(out, self.shard.detach().clone(), group=self.group,
                                           async_op=async_op)
        return (out, work) if async_op else out


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


class _ZeroDataParallel(Strategy):
    """ZeRO-1/2: full replicas for forward and backward, one flat shard per rank for the optimizer."""

    shard_gradients: bool = False

    def __init__(self, ctx, cfg, group=None, make_optimizer: Callable | None = None):
        super().__init__(ctx, cfg)
        self.group = group
        self.model = self.new_model()
        broadcast_parameters(self.model, group)                 # every replica starts from rank 0's weights
        self.flat = FlatShard(self.model.parameters(), group, keep_full=True)
        make = make_optimizer or self.new_optimizer
        self.optimizer = make([self.flat.shard])                # the optimizer only ever sees the shard
        if not self.shard_gradients:
            # ZeRO-1 keeps full gradients: let autograd accumulate straight into one flat buffer.
            self.flat_grad = torch.zeros_like(self.flat.full)   # (padded,)
            for p, view in zip(self.flat.params, self.flat.views(self.flat_grad)):
                p.grad = view

    def train_step(self, x, y):
        x, y = data_parallel_batch(self, x, y)                  # (B/dp, T) each
        flat = self.flat
        if self.shard_gradients:
            flat.shard.grad = None
            loss_sum = 0.0
            for xb, yb in self._micro(x, y):                    # reduce-scatter after every micro-batch
                loss_sum += self._forward_backward(xb, yb)
                grad = flat.flatten([p.grad for p in flat.params])   # (padded,) transient
                for p in flat.params:
                    p.grad = None                               # drop the full gradients at once
                part = flat.reduce_scatter_mean(grad)           # (s,)
                flat.shard.grad = part if flat.shard.grad is None else flat.shard.grad.add_(part)
            count = x.size(0)
        else:
            self.flat_grad.zero_()
            loss_sum, count = self.accumulate(self.model, x, y)
            flat.shard.grad = flat.reduce_scatter_mean(self.flat_grad)   # (s,) transient
        self.optimizer.step()                                   # updates this rank's chunk of flat.full
        if not self.shard_gradients:
            flat.shard.grad = None                              # ZeRO-1's resident gradients are the full ones
        flat.all_gather(out=flat.full)                          # every replica gets every updated chunk
        return loss_sum, count

    def _micro(self, x, y):
        return split_microbatches(x.to(self.ctx.device), y.to(self.ctx.device), self.cfg.microbatches)

    def _forward_backward(self, xb, yb) -> float:
        loss = type(self.model).loss(self.model(xb), yb)
        (loss / self.cfg.microbatches).backward()
        return loss.item() * xb.size(0)

    def state_tensors(self):
        grads = [self.flat.shard.grad] if self.shard_gradients else [p.grad for p in self.flat.params]
        return {"params": list(self.model.parameters()),      # views of flat.full: Ψ elements
                "grads": [g for g in grads if g is not None],
                "optimizer": optimizer_state_tensors(self.optimizer)}


@register("zero1")
class Zero1(_ZeroDataParallel):
    shard_gradients = False


@register("zero2")
class Zero2(_ZeroDataParallel):
    shard_gradients = True
