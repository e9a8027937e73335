"""The activation bytes autograd saves for backward, measured with its saved-tensor hooks: one meter for the course.

    with SavedBytes(model) as saved:    # counts what the forward inside saves for backward
        y = model(x)
    saved.bytes    # held now by live graphs (y's): each storage once, by its full size; parameters left out
    saved.peak     # the most `bytes` ever was
    saved.total    # every storage ever saved, alive or not (`kept`: its address -> (shape, bytes))

A tensor counts from the forward that saves it until autograd drops it (after its backward, or with its graph,
as after a trial run); a ReLU's output, saved by the ReLU and by the next Linear, counts once. A checkpointed
region saves only its inputs here (checkpoint's own hooks take over inside). `keep`, a pack hook that hands
autograd back what it got (a tensor-parallel region's `saving(meter)`), feeds only `kept` and `total`. Used by
sequence parallelism (a layer's bytes), exercise 10 (`bytes`, handed out) and exercise 11's check (`peak`).
"""
from __future__ import annotations

import weakref
from typing import Iterable

import torch
import torch.nn as nn


class _Held:   # what the pack hook hands autograd instead of the tensor: alive as long as the graph keeps it
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Context manager counting the bytes autograd saves for backward inside it; see the module's docstring."""

    def __init__(self, model: nn.Module | Iterable[torch.Tensor] = ()):
        params = model.parameters() if isinstance(model, nn.Module) else model
        self._params = {p.untyped_storage().data_ptr() for p in params}
        self._live: dict[int, list[int]] = {}   # storage address -> [packed copies alive, bytes]
        self.kept: dict[int, tuple[tuple[int, ...], int]] = {}
        self.bytes = self.peak = 0
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "SavedBytes":
        super().__enter__()
        return self

    @property
    def total(self) -> int:
        return sum(nbytes for _, nbytes in self.kept.values())

    def keep(self, kept):
        """Note what a region's own pack hook keeps (a tensor, or a sequence-parallel re-gather token that keeps
        its shard) in `kept`; return it unchanged."""
        t = kept if isinstance(kept, torch.Tensor) else kept[0].shard
        storage = t.untyped_storage()
        if storage.data_ptr() not in self._params:
            self.kept[storage.data_ptr()] = (tuple(t.shape), storage.nbytes())
        return kept

    def _pack(self, tensor: torch.Tensor):
        key = tensor.untyped_storage().data_ptr()
        if key in self._params:
            return tensor
        self.keep(tensor)
        entry = self._live.setdefault(key, [0, tensor.untyped_storage().nbytes()])
        if entry[0] == 0:
            self.bytes += entry[1]
            self.peak = max(self.peak, self.bytes)
        entry[0] += 1
        held = _Held(tensor)
        weakref.finalize(held, self._drop, key)   # holds no reference to `held`
        return held

    def _drop(self, key: int) -> None:
        entry = self._live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes -= entry[1]
            del self._live[key]

    @staticmethod
    def _unpack(held) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held
