"""Side-by-side timing of strategies in one run: the piece every `benchmarks/*_vs_*.py` script shares.

Two implementations are compared inside the *same* processes: each step, every contender trains on the same
global batch in turn (so drift in machine load hits all alike), behind a barrier, and a step's time is the
slowest rank's. Read the ratio of medians, not the seconds: on a shared CPU the seconds are noisy.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from partrain_edu.data import SyntheticTokens


def slowest(seconds: float, group=None) -> float:
    """The largest of every rank's `seconds`: a step is as slow as its slowest rank."""
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def alternate_steps(contenders: dict, steps: int, warmup: int = 3, global_batch: int = 16,
                    data: SyntheticTokens | None = None) -> dict[str, dict[str, list[float]]]:
    """Train each `Strategy` in `contenders` for `warmup + steps` steps, alternating step by step.

    Returns {"times": {name: [seconds per timed step]}, "losses": {name: [global-mean loss per step]}}."""
    data = data or SyntheticTokens()
    times = {name: [] for name in contenders}
    losses = {name: [] for name in contenders}
    for step in range(warmup + steps):
        x, y = data.global_batch(step, global_batch)
        for name, strategy in contenders.items():
            dist.barrier()
            start = time.perf_counter()
            loss_sum, count = strategy.train_step(x, y)
            elapsed = slowest(time.perf_counter() - start)
            totals = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
            dist.all_reduce(totals)  # the global mean: only the ranks that own a loss contribute
            losses[name].append(float(totals[0] / totals[1]))
            if step >= warmup:
                times[name].append(elapsed)
    return {"times": times, "losses": losses}
