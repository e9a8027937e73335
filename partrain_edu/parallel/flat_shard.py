"""One flat buffer of parameters, sharded over the ranks of a group: the piece ZeRO-1/2/3 and FSDP share.

Rajbhandari et al. 2020 ("ZeRO", §5) and Zhao et al. 2023 ("PyTorch FSDP", §3.2, FlatParameter): the Ψ
elements of `params` (one dtype, one device) are laid end to end and padded to ⌈Ψ/n⌉·n; rank k owns the
contiguous chunk [k·s, (k+1)·s), s = ⌈Ψ/n⌉. A reduce-scatter of a (padded,) gradient hands each rank the sum
of its own chunk; an all-gather of the chunks rebuilds the buffer: (n−1)/n·Ψ·bytes sent by each, twice.

A chunk cuts through parameters, so it is also kept as *pieces*: `pieces[i]` is this rank's part of parameter
i, a 1-D nn.Parameter viewing the chunk (FSDP's `use_orig_params`). An optimizer given the pieces keeps
single-process semantics per parameter: its own param group (lr, weight decay), its own `step`, and no update
at all when the parameter got no gradient (piece.grad is None), where one flat parameter would decay it.
"""
from __future__ import annotations

from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn


class FlatShard:
    """`params` in one (padded,) buffer; this rank keeps the chunk `data` (s,) and its `pieces`.

    keep_full=True (ZeRO-1/2): the full buffer stays, the parameters become views of it and `data` is a view
    of this rank's chunk — the weights are their own master copy, no byte is held twice.
    keep_full=False (ZeRO-3/FSDP): only the chunk stays; the caller gathers the buffer when it needs it."""

    def __init__(self, params: Iterable[torch.Tensor], group=None, keep_full: bool = True):
        self.params, self.group = list(params), group
        if not self.params:
            raise ValueError("FlatShard needs at least one parameter")
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) > 1:
            raise ValueError(f"one FlatShard holds one dtype on one device, got {sorted(map(str, kinds))}: "
                             "make one FlatShard per dtype (see `by_dtype`)")
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.spans, start = [], 0                               # parameter i is flat[a:b]
        for p in self.params:
            self.spans.append((start, start + p.numel(), p.shape))
            start += p.numel()
        self.numel = start
        self.shard_numel = -(-start // self.world)              # s = ⌈Ψ/n⌉
        self.padded = self.shard_numel * self.world
        p0 = self.params[0]
        full = torch.zeros(self.padded, dtype=p0.dtype, device=p0.device)   # (padded,)
        with torch.no_grad():
            for p, view in zip(self.params, self.views(full), strict=True):
                view.copy_(p)
        lo = self.rank * self.shard_numel
        if keep_full:
            self.full = full
            for p, view in zip(self.params, self.views(full), strict=True):
                p.data = view                                   # the module now reads the flat buffer
            self.data = full[lo:lo + self.shard_numel]          # (s,) a view, no copy
        else:
            self.full = None
            self.data = full[lo:lo + self.shard_numel].clone()  # (s,) the only copy
        # Where parameter i meets this chunk: chunk[lo_i:hi_i] holds its flat elements [lo_i + lo − a, …).
        self.bounds = [(min(max(a - lo, 0), self.shard_numel), min(max(b - lo, 0), self.shard_numel))
                       for a, b, _ in self.spans]
        self.pieces = [nn.Parameter(self.data[x:y], requires_grad=True) for x, y in self.bounds]

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Each parameter's place in a (padded,) buffer, shaped like the parameter."""
        return [flat[a:b].view(shape) for a, b, shape in self.spans]

    def piece_of(self, i: int, full_tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of a tensor shaped like parameter i (its gradient, or an optimizer state)."""
        a = self.spans[i][0]
        x, y = self.bounds[i]
        lo = self.rank * self.shard_numel
        return full_tensor.reshape(-1)[lo + x - a:lo + y - a]

    def flatten(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        """(padded,) buffer of `tensors` laid out like the parameters; None and the padding are zeros."""
        flat = torch.zeros(self.padded, dtype=self.data.dtype, device=self.data.device)
        for t, view in zip(tensors, self.views(flat), strict=True):
            if t is not None:
                view.copy_(t)
        return flat

    def reduce_scatter_mean(self, flat: torch.Tensor) -> torch.Tensor:
        """(s,) this rank's chunk of the mean over ranks of `flat` (padded,). Divided first, as DDP does."""
        flat.div_(self.world)                                   # `flat` is the caller's scratch buffer
        out = torch.empty(self.shard_numel, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter_single(out, flat, group=self.group)
        return out

    def all_gather(self, out: torch.Tensor | None = None, async_op: bool = False, dtype: torch.dtype | None = None):
        """Every rank's chunk, concatenated into `out` (padded,) (a new buffer when None), in `dtype` (the
        chunk's own when None; FSDP's mixed precision gathers in its param_dtype: fewer bytes on the wire)."""
        if out is None:
            out = torch.empty(self.padded, dtype=dtype or self.data.dtype, device=self.data.device)
        # A copy of the chunk goes in: under ZeRO-1/2 the chunk is a view of `out` itself, and a collective
        # whose input aliases its output is undefined on some backends.
        work = dist.all_gather_single(out, self.data.detach().to(out.dtype, copy=True), group=self.group,
                                      async_op=async_op)
        return (out, work) if async_op else out

    def set_piece_grads(self, grad: torch.Tensor | None, used: list[bool]) -> None:
        """Hand the chunk's gradient (s,) to the pieces; a parameter that got no gradient gets None, as in
        one process (an optimizer then leaves it, its state and its step count alone)."""
        for piece, (x, y), u in zip(self.pieces, self.bounds, used, strict=True):
            piece.grad = grad[x:y] if (u and grad is not None) else None

    def chunk_of(self, per_piece: list[torch.Tensor | None]) -> torch.Tensor:
        """(s,) one tensor per piece (an optimizer state) laid out like this rank's chunk; None → zeros."""
        chunk = torch.zeros_like(self.data)
        for t, (x, y) in zip(per_piece, self.bounds, strict=True):
            if t is not None:
                chunk[x:y] = t.reshape(-1)
        return chunk

    def gather_state(self, per_piece: list[torch.Tensor | None]) -> torch.Tensor:
        """All-gather a per-element state given per piece (None → zeros): the (numel,) buffer, every rank."""
        mine = self.chunk_of(per_piece)
        out = torch.empty(self.padded, dtype=mine.dtype, device=mine.device)
        dist.all_gather_single(out, mine, group=self.group)
        return out[:self.numel]


def by_dtype(params: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Parameters split by (dtype, device), order kept, each tensor once (a tied weight appears once)."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    seen: set[int] = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            groups.setdefault((p.dtype, p.device), []).append(p)
    return list(groups.values())
