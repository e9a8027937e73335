"""What would make a layout fit: the first of the usual memory savings, one at a time, then together, on the same
GPUs — the hint `partrain-edu estimate` prints under "does NOT fit".

The order is the cost each saving adds to a step, cheapest first (notebook 03 and 10): ZeRO-1 and -2 shard the
optimizer states and gradients for (almost) no extra traffic; selective recompute re-runs the attention scores
(a few %, Korthikanti et al. 2022); ZeRO-3 gathers the weights again for every micro-batch (1.5× DDP's bytes); full
recompute re-runs the whole forward (+33 % FLOPs). A smaller micro-batch costs efficiency, more GPUs cost money:
both come last, and only as words.
"""
from __future__ import annotations

from dataclasses import replace

from partrain_edu.theory.estimate import estimate
from partrain_edu.theory.layout import Layout
from partrain_edu.theory.layout_memory import TIGHT
from partrain_edu.theory.model_spec import ModelSpec

LADDER = ("none", "selective", "full")


def _changes(layout: Layout) -> list[tuple[str, dict]]:
    steps = [(f"--zero {z}", {"zero": z}) for z in (1, 2, 3) if layout.dp > 1 and layout.zero < z]
    now = LADDER.index(layout.recompute) if layout.recompute in LADDER else 1  # selective-op: as selective
    steps += [(f"--recompute {r}", {"recompute": r}) for r in LADDER[now + 1:]]
    if layout.micro_batch > 1:
        steps.append(("--micro-batch 1", {"micro_batch": 1}))
    if layout.dp > 1 and layout.zero < 3:
        steps.append(("--zero 3 --recompute full", {"zero": 3, "recompute": "full"}))
    return steps


def fits_with(model: ModelSpec, layout: Layout, device: str, memory_bytes: float | None = None) -> str:
    """One line: the first change (flags) that makes `layout` fit on the same GPUs within the planner's 90 % of
    memory (layout_memory.TIGHT), or what to change instead."""
    for flags, change in _changes(layout):
        try:
            trial = estimate(model, replace(layout, **change), device, memory_bytes=memory_bytes)
        except ValueError:
            continue
        if trial.memory_fraction <= TIGHT:  # with the allocator's room, as the planner plans
            return (f"fits with {flags}: {trial.memory.total / 1e9:.1f} GB, step {trial.step_time_s:.3g} s "
                    f"(MFU {trial.mfu:.1%})")
    more = "more data-parallel GPUs with --zero 3" if layout.dp == 1 else "more GPUs"
    gpus = f"{layout.gpus} GPUs" if layout.gpus > 1 else "1 GPU"
    return (f"none of --zero, --recompute or --micro-batch 1 fits it on {gpus}: use {more}, a larger --tp or --pp, "
            "or ask `partrain-edu plan` for a layout that fits")
