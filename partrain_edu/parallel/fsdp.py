"""ZeRO-3 / FSDP (完全分片数据并行) over any nn.Module: parameters, gradients and optimizer states sharded.

    fsdp = FullyShardedDataParallel(model, units=lambda name, m: isinstance(m, Block)); AdamW(fsdp.parameters())

Rajbhandari et al. 2020 ("ZeRO", §5.3), Zhao et al. 2023 ("PyTorch FSDP", §3). **Sharded**: the model is cut
into units (default: every child of every ModuleList/ModuleDict) and the root, which owns the rest
(fsdp_layout.py); a unit's parameters of one dtype form a `FlatShard`, a rank keeps ⌈Ψ_u/n⌉ of them. fp32 +
AdamW per rank: params, grads 4⌈Ψ/n⌉ each, optimizer 8⌈Ψ/n⌉, plus the gathered units (`peak_gathered_bytes`).
**Sent** per unit and micro-batch (§7.2.2), the four phases below: (1) all-gather before its forward, (2) free
after it, (3) all-gather again in backward, (4) reduce-scatter its gradient: 3·(n−1)/n·Ψ·bytes, 1.5× DDP's.
One unit's mechanics: fsdp_unit.py. `MixedPrecision(torch.bfloat16)` (zero3-bf16) gathers and reduce-scatters in
bf16, half the bytes; the shard stays the fp32 master. `parameters()`: this rank's 1-D *pieces* under the original
names (use_orig_params), stepped per parameter as in one process. `state_dict()`: the unwrapped module's
(fsdp_state.py); `clip_grad_norm_`, `no_sync()`: docs/pytorch_semantics.md.

Read fsdp_naive.py first: the same four phases with the whole model as one unit, in 80 lines. What each addition
here is for: units (the gathered peak is the root plus one unit, not the whole model); `prefetch` (the next
unit's all-gather overlaps this one's compute); mixed precision (half the bytes on the wire); pieces per parameter
(param groups, a parameter without a gradient left alone); frozen parameters and each dtype in buffers of their
own; a tied weight owned by the root; re-gathering for activation checkpointing; `no_sync()`; `clip_grad_norm_`;
`state_dict()` / `summon_full_params()` (fsdp_state.py).
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable, Iterable

import torch
import torch.nn as nn

from partrain_edu.parallel import clipping, fsdp_state
from partrain_edu.parallel.buckets import OncePerBackward
from partrain_edu.parallel.ddp import broadcast_parameters
from partrain_edu.parallel.flat_shard import FlatShard
from partrain_edu.parallel.fsdp_layout import choose_units, shard_units
from partrain_edu.parallel.fsdp_unit import Unit, UnitShard, in_backward
from partrain_edu.parallel.mixed_precision import MixedPrecision, cast_floating

__all__ = ["FullyShardedDataParallel", "MixedPrecision"]   # MixedPrecision is shared with DDP: mixed_precision.py


class FullyShardedDataParallel(nn.Module):
    """ZeRO-3 over `module` (same init on every rank is not needed: rank 0's parameters and buffers are
    broadcast). `units`: submodules (a list, or a ModuleList), a policy `callable(name, module) -> bool`, or None
    (the children of every ModuleList/ModuleDict). Frozen parameters are sharded in their own FlatShard:
    gathered, never reduced, no gradient. A parameter used by two units (tied) is owned by the root.
    Every rank must use the same parameters in a step, as DDP without find_unused_parameters: a unit run on
    some ranks only leaves its reduce-scatter waiting, a parameter used on some ranks only is stepped there
    only. `timeline` holds (event, unit, time) of the latest forward and its backward: cleared when a forward
    starts, so it stays bounded. Wrap on the device you train on (`.to()` does not move the shards)."""

    def __init__(self, module: nn.Module, group=None, units: Iterable[nn.Module] | Callable | None = None,
                 mixed_precision: MixedPrecision | None = None, prefetch: bool = False):
        super().__init__()
        self.module = module
        self.group = group
        self.prefetch = prefetch
        self.sync = True                                    # False inside no_sync(): gradients kept full
        self.mixed_precision = mixed_precision or MixedPrecision()
        broadcast_parameters(module, group)                 # every rank shards rank 0's weights and buffers
        self.gathered_bytes_now, self.peak_gathered_bytes = 0, 0
        self.timeline: list[tuple[str, int, float]] = []
        self.gathered: dict[int, UnitShard] = {}            # id(gathered buffer) → its shard, while forward runs
        self._sweep = OncePerBackward(self._free_after_backward)
        chosen = choose_units(module, units)
        self.units = [Unit(0, module, self)] + [Unit(i + 1, m, self) for i, m in enumerate(chosen)]
        self._names: dict[int, list[str]] = {}              # id(parameter) → its names, one process's order
        for name, p in module.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(p), []).append(name)
        order = [id(p) for p in module.parameters()]
        shard_units(self.units, module, self.mixed_precision)   # the attributes become slots: fsdp_layout.py
        where = {id(p): piece for s in self.shards() for p, piece in zip(s.flat.params, s.flat.pieces, strict=True)}
        self._pieces = [(self._names[i], where[i]) for i in order]
        for u in self.units[1:]:
            u.module.register_forward_pre_hook(lambda mod, args, kwargs, u=u: self._enter(u, args, kwargs),
                                               with_kwargs=True)
            u.module.register_forward_hook(lambda mod, args, out, u=u: u.free_after_forward())

    # -- the ZeRO-3 story, in four phases --------------------------------------------------------------
    def forward(self, *args, **kwargs):
        self.timeline.clear()                               # bounded: one forward (and its backward)
        for s in self.shards():
            s.drop_pending()
        args, kwargs = cast_floating((args, kwargs), self.mixed_precision.param_dtype)
        # Saved tensors that view a gathered unit keep (shard, layout) instead (phase 2), re-gathered on use (3)
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            if self.prefetch and len(self.units) > 1:
                self.units[1].prefetch()
            self.units[0].gather_for_forward()              # the root stays gathered through the forward
            try:                                            # each unit: _enter (1), its hook frees it (2)
                return cast_floating(self.module(*args, **kwargs), self.mixed_precision.output_dtype)
            finally:
                for u in self.units:                        # the root; any unit an exception left gathered
                    if u.index == 0 or any(s.full is not None for s in u.shards):
                        u.free_after_forward()
                if self.prefetch and len(self.units) > 1:
                    self.units[-1].prefetch()               # backward starts with the last unit

    # 1. gather a unit's parameters before its forward (and prefetch the next unit's)
    def _enter(self, unit: Unit, args, kwargs):
        unit.gather_for_forward()
        if self.prefetch and unit.index + 1 < len(self.units) and not in_backward():   # not a recomputation
            self.units[unit.index + 1].prefetch()           # overlaps with this unit's compute
        return cast_floating((args, kwargs), self.mixed_precision.param_dtype)

    # 2. free them after its forward (`Unit.free_after_forward`): autograd must not keep the gathered buffer
    #    alive through a saved weight, so a weight saved for backward is kept as (shard, layout), not a view
    def _pack(self, t: torch.Tensor):
        shard = self.gathered.get(id(t._base)) if t._base is not None else None
        if shard is not None and t._base is shard.full:     # a weight (or its transpose) viewing a gathered unit
            return shard, t.size(), t.stride(), t.storage_offset()
        return t

    # 3. gather again in backward, when autograd first unpacks one of them; free when the backward ends
    def _unpack(self, packed):
        if isinstance(packed, tuple):
            shard, size, stride, offset = packed
            return shard.full_for_backward().as_strided(size, stride, offset)
        return packed

    def regathered(self, shard: UnitShard) -> None:
        """A shard was gathered again in backward: prefetch the unit backward reaches next (blocks run in
        reverse), and free whatever is still gathered when this backward ends (frozen shards have no _Gather)."""
        if self.prefetch and shard.unit.index > 1:
            self.units[shard.unit.index - 1].prefetch()
        self._sweep.arm()

    def _free_after_backward(self) -> None:
        for s in self.shards():
            s.free_backward()

    # 4. reduce-scatter a unit's gradient when its backward is done: `fsdp_unit._Gather.backward` returns each
    #    piece its part, which autograd sums into piece.grad (micro-batches too, as in one process)

    # -- what the optimizer, the checkpoint and the tests see -------------------------------------------
    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """This rank's pieces (1-D, possibly empty) under the wrapped module's parameter names."""
        for names, piece in self._pieces:
            for name in names[:1] if remove_duplicate else names:
                yield prefix + name, piece

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self.module.named_buffers(prefix, recurse, remove_duplicate)

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside keep each unit's full gradient, summed locally (no reduce-scatter; memory: the whole
        unsharded gradient); the first backward after it reduce-scatters the sum, once — FSDP1's no_sync."""
        self.sync = False
        try:
            yield
        finally:
            self.sync = True

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """Clip every piece's gradient by the norm of the whole (averaged) gradient, and return that norm:
        one all-reduce of the pieces' Σ|g|ᵖ (FSDP1's `clip_grad_norm_`)."""
        grads = [p.grad for _, p in self._pieces if p.grad is not None]
        device = self.shards()[0].flat.data.device if self.shards() else None
        return clipping.clip_shards_(grads, max_norm, norm_type, self.group, error_if_nonfinite, device=device)

    def shards(self) -> list[UnitShard]:
        return [s for u in self.units for s in u.shards]

    def flat_shards(self) -> list[FlatShard]:
        """Every unit's FlatShards, frozen ones included: unit by unit (root first), then by (dtype, trainable)
        in the order the parameters first appear — the same on every rank and for every world size."""
        return [s.flat for s in self.shards()]

    # the unsharded view, gathered (collectives) or loaded (local): fsdp_state.py
    def summon_full_params(self):
        """Every parameter gathered in its own dtype and readable on the module (no grad, read-only;
        a collective: every rank enters it)."""
        return fsdp_state.summon_full_params(self)

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """One process's `module.state_dict()`, full and unsharded. A collective: every rank calls it."""
        return fsdp_state.full_state_dict(self, destination=destination, prefix=prefix)

    full_state_dict = state_dict

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """Load a full state dict (one process's format): keep this rank's chunk of every parameter. Local."""
        return fsdp_state.load_full_state_dict(self, state_dict, strict=strict)

    # -- bookkeeping the units report to --------------------------------------------------------------
    def track(self, delta: int) -> None:
        """Bytes of gathered buffers alive now (+ when an all-gather allocates one, − when it is freed)."""
        self.gathered_bytes_now += delta
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes_now)

    def log(self, event: str, unit: Unit) -> None:
        self.timeline.append((event, unit.index, time.perf_counter()))
