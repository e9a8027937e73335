"""Notebook 13's probe into PyTorch's zero-bubble stage: which backward each of its I and W actions runs.

    counted = record_backward_kinds(strategy.stage)   # a torch-pp-zb strategy's PipelineStage, before it runs
    ...                                               # run the schedule; then counted == {"I ran input": 24, ...}

torch 2.13's `_PipelineStage.backward_one_chunk(full_backward=False)` (an I action) asks autograd for the
stage input's gradient (`stage_backward_input`: "input"), and `backward_weight_one_chunk` (a W action) then
for the weights' (`stage_backward_weight`: "weight"); both go through `backward_maybe_with_nosync(kind, ...)`.
On the first stage the input needs no gradient: I skips the call, and W runs the whole backward ("full").
"""
from __future__ import annotations

import collections


def record_backward_kinds(stage) -> collections.Counter:
    """Wrap `stage` (a `torch.distributed.pipelining` stage) so that each I, B and W action it runs is counted
    with the backward kinds it called: "I ran input", "W ran weight", "I ran nothing", "W ran full", ..."""
    counted: collections.Counter = collections.Counter()
    calls: list[str] = []
    run_backward = stage.backward_maybe_with_nosync

    def backward(kind, *args, **kwargs):
        calls.append(kind)
        return run_backward(kind, *args, **kwargs)

    def action(method, name_of):
        def run(*args, **kwargs):
            calls.clear()
            result = method(*args, **kwargs)
            counted[f"{name_of(kwargs)} ran {'+'.join(calls) or 'nothing'}"] += 1
            return result
        return run

    stage.backward_maybe_with_nosync = backward
    stage.backward_one_chunk = action(stage.backward_one_chunk,
                                      lambda kw: "B" if kw.get("full_backward", True) else "I")
    stage.backward_weight_one_chunk = action(stage.backward_weight_one_chunk, lambda kw: "W")
    return counted
