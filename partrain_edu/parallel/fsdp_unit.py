"""One FSDP unit's mechanics: its flat shards, the all-gather before it computes, the re-gather in backward.

    unit.gather_for_forward(); ...; unit.free_after_forward()      (FullyShardedDataParallel's hooks call these)

Zhao et al. 2023 ("PyTorch FSDP", §3.2–3.3), Rajbhandari et al. 2020 ("ZeRO", §5.3): a unit keeps a chunk of
each `FlatShard` (one per dtype, frozen parameters apart). Sent per micro-batch: all-gather before forward,
again before backward, reduce-scatter of the gradient: 3·(n−1)/n·Ψ_u·bytes (gathers in the compute dtype).
- `_Gather` (autograd Function): pieces → gathered (padded,) buffer, whose views the module computes with. Its
  backward gets the buffer's gradient (all uses summed), reduce-scatters it and returns each piece its part —
  None for a parameter no use reached (a hook on its view marks it): autograd then sums micro-batches into
  `piece.grad` and leaves an unused one alone, as in one process.
- Saved-tensors hooks keep (shard, offset, shape) instead of a view, so the buffer is freed after forward and
  gathered again at the first unpack in backward (a unit no backward op reads, e.g. a first layer whose input
  needs no gradient, is not re-gathered: fewer bytes, never more).
- Gathered inside a backward (a checkpoint recomputing the unit): freed when the unit's backward is done.
  `fsdp.no_sync()`: backward sums full gradients in `accumulated`; the next synced one reduce-scatters them.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from partrain_edu.parallel import clipping
from partrain_edu.parallel.flat_shard import FlatShard

OUTSIDE_FORWARD = ("is sharded by FullyShardedDataParallel outside its unit's forward: read the weights with "
                   "fsdp.state_dict() or inside `with fsdp.summon_full_params():`")


class ShardedAttribute:
    """What a module attribute holds outside its unit's forward, so a stray read names the fix (not a None)."""

    def __init__(self, where: str):
        self.where = where

    def __repr__(self) -> str:
        return f"<{self.where} {OUTSIDE_FORWARD}>"

    def __getattr__(self, attr):
        raise AttributeError(f"{self.where}.{attr}: {self.where} {OUTSIDE_FORWARD}")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        where = next((a.where for a in args if isinstance(a, ShardedAttribute)), "a parameter")
        raise RuntimeError(f"{getattr(func, '__name__', func)}: {where} {OUTSIDE_FORWARD}")


class _Gather(torch.autograd.Function):
    """pieces → full (padded,) by all-gather; backward: reduce-scatter the gradient, a part per used piece."""

    @staticmethod
    def forward(ctx, shard: "UnitShard", used: list[bool], *pieces: torch.Tensor) -> torch.Tensor:
        ctx.shard, ctx.used = shard, used
        return shard.take_gathered()

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        shard = ctx.shard
        shard.owner.log("done", shard.unit)                 # this unit's backward has computed
        shard.free_backward()
        grad_full, used = shard.accumulate(grad_full, ctx.used)
        if grad_full is None:                               # inside no_sync(): kept, reduced later
            return (None, None, *(None for _ in used))
        chunk = shard.reduce(grad_full)                     # (s,) in the master dtype
        return (None, None, *(chunk[x:y] if u else None for u, (x, y) in zip(used, shard.flat.bounds, strict=True)))


class UnitShard:
    """One FlatShard of a unit: parameters of one dtype, all trainable or all frozen, and the module
    attributes ("slots") each one fills — several for a parameter tied inside the unit, all given one view."""

    def __init__(self, unit: "Unit", params: list[nn.Parameter], slots: list[list[tuple[nn.Module, str, str]]],
                 keep_dtype: bool = False):
        self.unit = unit
        self.owner = unit.owner
        self.slots = slots
        self.trainable = params[0].requires_grad
        self.flat = FlatShard(params, self.owner.group, keep_full=False)
        for piece in self.flat.pieces:
            piece.requires_grad_(self.trainable)
            if self.trainable:                            # a norm of a piece's gradient is refused
                clipping.mark_on_accumulate(piece, clipping.FSDP)
        self.accumulated: tuple[torch.Tensor, list[bool]] | None = None   # no_sync's (padded,) sum, used
        # gathered (and computed) in this dtype; keep_dtype: BatchNorm's, beside its fp32 running statistics
        master = self.flat.data.dtype
        self.dtype = master if keep_dtype else self.owner.mixed_precision.compute_dtype(master)
        self.nbytes = self.flat.padded * torch.empty((), dtype=self.dtype).element_size()
        self.full: torch.Tensor | None = None             # (padded,) gathered for forward
        self.backward_full: torch.Tensor | None = None    # (padded,) gathered again for backward
        self.recomputed: list[torch.Tensor] = []          # (padded,) gathered for a checkpoint's recomputation
        self._pending = None                              # (buffer, work) of an all-gather in flight
        self.set_views(None)
        self.register(self.flat.pieces)

    def register(self, tensors: list[torch.Tensor]) -> None:
        """Register `tensors` (the pieces; the full views while a state dict is built) as the module's
        parameters: `module.named_parameters()` lists every parameter, as FSDP2's DTensors stay visible.
        Forward reads the attribute itself (`set_views`), which shadows the registration."""
        for t, slots in zip(tensors, self.slots, strict=True):
            for module, attr, _ in slots:
                module._parameters[attr] = t

    def accumulate(self, grad_full: torch.Tensor, used: list[bool]):
        """(gradient to reduce now or None, used): outside no_sync the sum with what no_sync kept."""
        if self.accumulated is not None:
            total, before = self.accumulated
            grad_full, used = total.add_(grad_full), [a or b for a, b in zip(before, used, strict=True)]
        if self.owner.sync:
            self.accumulated = None
            return grad_full, used
        if self.accumulated is None:                      # in the master dtype: bf16 would round each sum
            grad_full = grad_full.to(self.flat.data.dtype, copy=True)
        self.accumulated = (grad_full, used)
        return None, used

    def prefetch(self) -> None:
        if self._pending is None:
            self._pending = self.flat.all_gather(async_op=True, dtype=self.dtype)
            self.owner.track(self.nbytes)
            self.owner.log("issue", self.unit)

    def take_gathered(self) -> torch.Tensor:
        """The full buffer: the prefetched one once its all-gather is done, else gathered now."""
        self.prefetch()
        out, work = self._pending
        self._pending = None
        work.wait()
        self.owner.log("ready", self.unit)
        return out

    def drop_pending(self) -> None:
        """A prefetch nobody took (the unit did not run): its buffer would be stale after the next step."""
        if self._pending is not None:
            self._pending[1].wait()
            self._pending = None
            self.owner.track(-self.nbytes)

    def set_views(self, full: torch.Tensor | None) -> list[torch.Tensor]:
        """Point every slot at its view of `full` (or at a ShardedAttribute when None)."""
        views = self.flat.views(full) if full is not None else [None] * len(self.slots)
        for view, slots in zip(views, self.slots, strict=True):
            for module, attr, name in slots:
                module.__dict__[attr] = view if view is not None else ShardedAttribute(name)
        return views

    def gather_for_forward(self) -> None:
        if self.trainable and torch.is_grad_enabled():
            used = [False] * len(self.slots)
            self.full = _Gather.apply(self, used, *self.flat.pieces)    # in the graph: gradients reach the pieces
            for i, view in enumerate(self.set_views(self.full)):
                view.register_hook(lambda grad, i=i: used.__setitem__(i, True))   # got a gradient: used
        else:                                             # frozen, or no_grad: nothing to differentiate
            self.full = self.take_gathered()
            self.set_views(self.full)
        if in_backward():                                 # checkpoint recomputing: freed after this backward
            self.recomputed.append(self.full)
            self.full = None
            self.owner.regathered(self)
        else:
            self.owner.gathered[id(self.full)] = self

    def free_after_forward(self) -> None:
        if self.full is not None:
            self.set_views(None)
            self.owner.gathered.pop(id(self.full), None)
            self.owner.track(-self.nbytes)
            self.full = None                              # saved tensors hold a (shard, layout) key, not it

    def full_for_backward(self) -> torch.Tensor:
        if self.backward_full is None:
            self.backward_full = self.take_gathered()
            self.owner.regathered(self)
        return self.backward_full

    def free_backward(self) -> None:
        if self.backward_full is not None:
            self.owner.track(-self.nbytes)
            self.backward_full = None
        if self.recomputed:
            self.owner.track(-self.nbytes * len(self.recomputed))
            self.recomputed = []
            self.set_views(None)

    def reduce(self, grad_full: torch.Tensor) -> torch.Tensor:
        """(s,) this rank's chunk of the gradient averaged over ranks, in reduce_dtype on the wire."""
        wire = self.owner.mixed_precision.wire_dtype(self.flat.data.dtype)
        chunk = self.flat.reduce_scatter_mean(grad_full.to(wire).contiguous())   # a scratch copy when cast
        return chunk.to(self.flat.data.dtype)


def in_backward() -> bool:
    """Whether autograd's engine is running a backward on this thread (a checkpoint's recomputation runs there)."""
    return torch._C._current_graph_task_id() != -1


class Unit:
    """A module whose own parameters (those of its sub-units excluded) are gathered while it computes."""

    def __init__(self, index: int, module: nn.Module, owner):
        self.index = index
        self.module = module
        self.owner = owner
        self.shards: list[UnitShard] = []

    @property
    def gathered_bytes(self) -> int:
        """Bytes one gather of this unit allocates (every shard, padded, in its compute dtype)."""
        return sum(s.nbytes for s in self.shards)

    def prefetch(self) -> None:
        for s in self.shards:
            s.prefetch()

    def gather_for_forward(self) -> None:
        for s in self.shards:
            s.gather_for_forward()

    def free_after_forward(self) -> None:
        self.owner.log("done", self)                      # this unit's forward has computed
        for s in self.shards:
            s.free_after_forward()
