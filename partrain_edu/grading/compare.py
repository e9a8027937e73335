"""Turn "these two tensors differ" into one sentence a learner can act on: shapes, first index, both values."""
from __future__ import annotations

import torch


class NotATensor:
    """What a learner's function gave instead of a tensor, in words ("NoneType"): what differ says it got."""

    def __init__(self, what: str):
        self.what = what


def _fmt(t: torch.Tensor, limit: int = 8) -> str:
    values = [round(float(v), 4) for v in t.reshape(-1)[:limit]]
    return str(values)[:-1] + (", …]" if t.numel() > limit else "]")


def differ(what: str, expected: torch.Tensor, got, rtol: float = 1e-5, atol: float = 1e-6) -> str | None:
    """None when `got` equals `expected` within tolerance, else a message naming shapes and the first mismatch."""
    if not isinstance(got, torch.Tensor):
        said = got.what if isinstance(got, NotATensor) else type(got).__name__
        return f"{what}: expected a tensor of shape {tuple(expected.shape)}, got {said}"
    if tuple(got.shape) != tuple(expected.shape):
        return f"{what}: expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
    got = got.detach().to(expected.dtype)
    close = torch.isclose(got, expected, rtol=rtol, atol=atol)
    if bool(close.all()):
        return None
    flat_bad = (~close).reshape(-1).nonzero().reshape(-1)
    first = int(flat_bad[0])
    ratio = ""
    nonzero = expected.abs() > 1e-8
    if bool(nonzero.any()):
        r = (got[nonzero] / expected[nonzero])
        if bool(torch.allclose(r, r.reshape(-1)[0].expand_as(r), rtol=1e-4)):
            ratio = f"; everywhere {float(r.reshape(-1)[0]):.4g}× the expected value"
    return (f"{what}: {len(flat_bad)} of {expected.numel()} values differ (shape {tuple(expected.shape)}), "
            f"first at flat index {first}: expected {float(expected.reshape(-1)[first]):.6g}, got "
            f"{float(got.reshape(-1)[first]):.6g}{ratio}; expected {_fmt(expected)}, got {_fmt(got)}")


def ratio_of(expected: torch.Tensor, got: torch.Tensor) -> float | None:
    """The constant factor got/expected if there is one (2.0 when an average is missing on 2 ranks), else None."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return None
    mask = expected.abs() > 1e-6
    if not bool(mask.any()):
        return None
    r = got.detach()[mask] / expected[mask]
    first = float(r.reshape(-1)[0])
    return first if bool(torch.allclose(r, torch.full_like(r, first), rtol=1e-3)) else None
