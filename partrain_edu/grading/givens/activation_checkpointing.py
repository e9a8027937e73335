"""Handed out by exercise 10 (activation checkpointing under a memory budget): the two measuring instruments
the check grades with, so that the learner's plan and the grader count the same bytes and the same FLOPs.
Neither is the answer: measuring each block, choosing which to recompute and running the choice is.

    with SavedBytes(block) as saved:           # count what autograd saves for backward while inside
        y = block(x)
    saved.bytes                                # bytes still held for y's backward: each storage once, no parameters
                                               # (a checkpointed block keeps only its input there)
    forward_flops(block, x)                    # FLOPs of one forward of block (torch's FlopCounterMode)
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from partrain_edu.parallel.saved_bytes import SavedBytes  # the course's one activation meter

__all__ = ["SavedBytes", "forward_flops"]


def forward_flops(block: nn.Module, x: torch.Tensor) -> int:
    """The FLOPs of one forward of `block` on `x` (2·m·n·k per matmul, as torch's FlopCounterMode counts; the
    elementwise activations are not counted): what recomputing the block costs."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        block(x)
    return int(counter.get_total_flops())
