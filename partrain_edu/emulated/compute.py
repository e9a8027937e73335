"""Charging a module's compute on the emulated device: forward `seconds`, backward 2 × `seconds`.

    handles = emulator.charge(stage, seconds=0.004)      # handles.remove() stops charging

When a forward starts (a pre-hook), and when a backward starts (a full backward pre-hook), the rank's emulated
clock moves by the cost·scale and the rank waits for wall time to keep pace; then the real arithmetic runs, its
wall time recorded (`report()["dominance"]`: charged / real, which should stay ≥ 10). Charging at the start
makes whatever the work triggers — a gradient hook that issues a bucket's all-reduce — happen at the emulated
end of the work. Backward costs twice the forward (two matrix products per forward one: the gradients of the
input and of the weight; Narayanan et al. 2021, §5.1). Charged modules must not nest (time counted twice).
While a window is open `emulator.inside` counts it: a traffic rule may price the module's messages as k layers'.
"""
from __future__ import annotations

import time
import warnings

import torch.nn as nn
from torch.utils.hooks import RemovableHandle


class Handles:
    def __init__(self, handles: list[RemovableHandle]):
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def charge(emulator, module: nn.Module, seconds: float) -> Handles:
    if not seconds >= 0:
        raise ValueError(f"a module's emulated cost must be ≥ 0 seconds, got {seconds}")
    # A module whose inputs need no gradient (an embedding) gets its backward "end" hook before its own work and
    # torch warns; only the real-time record is affected.
    warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed with "
                            "respect to module outputs")
    opened: list[float] = []   # wall time each window's real work began: how much real time hid inside

    def open_window(cost):
        emulator.compute(cost)
        emulator.inside += 1                       # messages from here on are this module's (links.py)
        opened.append(time.perf_counter())

    def close_window():
        if opened:
            emulator.inside -= 1
            emulator.real_s += time.perf_counter() - opened.pop()

    return Handles([
        module.register_forward_pre_hook(lambda mod, args: open_window(seconds)),
        module.register_forward_hook(lambda mod, args, out: close_window()),
        module.register_full_backward_pre_hook(lambda mod, grad_out: open_window(2 * seconds)),
        module.register_full_backward_hook(lambda mod, grad_in, grad_out: close_window()),
    ])
