"""Handed out by exercise 10 (activation checkpointing under a memory budget): the two measuring instruments
the check grades with, so that the learner's plan and the grader count the same bytes and the same FLOPs.
Neither is the answer: measuring each block, choosing which to recompute and running the choice is.

    with SavedBytes(block) as saved:           # count what autograd saves for backward while inside
        y = block(x)
    saved.bytes                                # bytes still held for y's backward: each storage once, no parameters
    forward_flops(block, x)                    # FLOPs of one forward of block (torch's FlopCounterMode)
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode


class _Held:
    """What the pack hook hands autograd instead of the tensor: alive exactly as long as the graph keeps it."""
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Context manager counting the activation bytes autograd saves for backward inside it.

    `.bytes` (read after the block, while its output lives) sums the storages of the saved tensors that a live
    graph still holds, each storage once by its full size — a ReLU's output, which the ReLU and the next
    Linear both save, counts once — leaving out the parameters of `model` (a Linear saves its weight, which
    lives anyway). Tensors saved by a graph already freed (a trial run) no longer count. A checkpointed region
    saves nothing through these hooks (checkpoint uses its own, inner ones) except its inputs, which
    `checkpoint(..., use_reentrant=False)` saves for the recomputation: exactly what it keeps alive.
    """

    def __init__(self, model: nn.Module):
        self._params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self._held: list[weakref.ref] = []
        super().__init__(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> _Held:
        held = _Held(tensor)
        self._held.append(weakref.ref(held))
        return held

    @staticmethod
    def _unpack(held: _Held) -> torch.Tensor:
        return held.tensor

    def __enter__(self) -> "SavedBytes":
        super().__enter__()
        return self

    @property
    def bytes(self) -> int:
        storages: dict[int, int] = {}
        for ref in self._held:
            held = ref()
            if held is None:
                continue
            storage = held.tensor.untyped_storage()
            if storage.data_ptr() not in self._params:
                storages[storage.data_ptr()] = storage.nbytes()
        return sum(storages.values())


def forward_flops(block: nn.Module, x: torch.Tensor) -> int:
    """The FLOPs of one forward of `block` on `x` (2·m·n·k per matmul, as torch's FlopCounterMode counts; the
    elementwise activations are not counted): what recomputing the block costs."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        block(x)
    return int(counter.get_total_flops())
