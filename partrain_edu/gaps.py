"""How far apart two computations are, in the form the notebooks print: the gap beside its tolerance.

Two ways of computing the same numbers in fp32 (a split matmul and the whole one, a rank's gradient and its slice
of the full gradient, a strategy's losses and `single`'s) differ by rounding. The gap that matters is relative to
the size of the values, so the course compares

    relative_gap(got, want) = max |got − want| / max |want|

with a tolerance set at least 10× above the gaps measured on this course's machines (any OMP thread count), and
prints both, the gap rounded up to one digit: `gap_text(gap, tol)` → "≤ 4e-09 (tolerance 1e-06)".
"""
from __future__ import annotations

import math
from typing import Iterable

import torch


def _flat(values) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().reshape(-1).double()
    if isinstance(values, (list, tuple)) and values and isinstance(values[0], torch.Tensor):
        return torch.cat([_flat(v) for v in values])
    return torch.tensor(list(values), dtype=torch.float64)


def relative_gap(got, want) -> float:
    """max |got − want| over max |want|: tensors, lists of tensors (flattened together) or lists of floats."""
    got, want = _flat(got), _flat(want)
    if got.shape != want.shape:
        raise ValueError(f"cannot compare {tuple(got.shape)} values with {tuple(want.shape)}")
    scale = want.abs().max().item()
    gap = (got - want).abs().max().item()
    return gap / scale if scale else gap


def round_up(x: float) -> float:
    """x rounded up to one significant digit (3.6e-09 → 4e-09, 9.8e-08 → 1e-07): a bound that still holds."""
    if x <= 0:
        return 0.0
    exponent = math.floor(math.log10(x))
    return math.ceil(round(x / 10 ** exponent, 9)) * 10 ** exponent


def gap_text(gap: float, tolerance: float) -> str:
    """'≤ 4e-09 (tolerance 1e-06)'; '0 (…)' when bit for bit equal; '0.19 (…)' when far apart."""
    shown = "0" if gap == 0 else f"{gap:.2f}" if gap >= 0.01 else f"≤ {round_up(gap):.0e}"
    return f"{shown} (tolerance {tolerance:.0e})"


def within(gap: float, tolerance: float) -> str:
    """gap_text plus the verdict in words, for a line that must say whether the check held."""
    return f"{gap_text(gap, tolerance)}: {'within' if gap <= tolerance else 'OUTSIDE'} it"


def pairs_gap(got: Iterable[float], want: Iterable[float]) -> float:
    """relative_gap of two equally long sequences of numbers (losses per step)."""
    got, want = list(got), list(want)
    if len(got) != len(want):
        raise ValueError(f"{len(got)} values against {len(want)}")
    return relative_gap(got, want)
