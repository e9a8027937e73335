"""PyTorch's own tensor parallelism (DTensor's `parallelize_module`) from the same plan as ours (tensor.py).

    parallelize_module(mlp, init_device_mesh("cpu", (2,)), dtensor_plan({"0": "colwise", "2": "rowwise"}))

**Sharded**: what `parallelize` shards, each style turned into its DTensor counterpart on a 1-D `DeviceMesh`:
"colwise" → `ColwiseParallel` (weight `Shard(0)`), "rowwise" → `RowwiseParallel` (`Shard(1)`), "vocab" →
`RowwiseParallel` on the embedding (its rows are tokens; the ids are whole on every rank). Parameters and
gradients are DTensors whose local shards are what a rank holds.

**Communicated**: the same all-reduces as ours (Shoeybi et al. 2019, §3), but DTensor decides them itself when a
tensor's layout must change (Partial → Replicate is an all-reduce). Our `inputs` become `PrepareModuleInput`: the
module's input turns into a DTensor once, so the colwise layers inside sum their input gradients locally and
all-reduce once, as our f does (left alone, each `ColwiseParallel` all-reduces its own).
TinyGPT's DTensor plan and the `torch-tp` strategy: strategies/torch_tp.py.
"""
from __future__ import annotations

from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel

from partrain_edu.parallel.tensor import STYLES


def dtensor_plan(plan: dict[str, str], inputs=()) -> dict:
    """`plan` ({name pattern: style}, as `parallelize` takes it) and its `inputs`, in DTensor's words."""
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
              "vocab": lambda: RowwiseParallel(input_layouts=Replicate())}  # token ids are whole on every rank
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r} for {pattern!r}: use one of {', '.join(STYLES)}")
    converted = {pattern: styles[style]() for pattern, style in plan.items()}
    for pattern in inputs:
        if pattern in converted:
            raise ValueError(f"{pattern!r} is both a plan entry and an input: list in `inputs` the module that "
                             "holds the colwise layers, not a layer")
        converted[pattern] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                                use_local_output=False)
    return converted
