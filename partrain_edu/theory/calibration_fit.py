"""Fitting `calibration.FITTED` on the training rows of `theory.published_runs`: nothing in it is tuned by hand.

η_max per device, then the shared terms (w½, the per-layer overhead, the link efficiency, the overlap cost), each by
golden-section search on Σ log²(predicted / reported) within physical BOUNDS, for a few rounds of coordinates. Each
paper's rows weigh one paper in all. A test checks `fit() == calibration.FITTED`.

    python -m partrain_edu.theory.calibration_fit      # prints the fit, to paste into calibration.FITTED
"""
from __future__ import annotations

import math

from partrain_edu.theory.calibration import SAME_CHIP
from partrain_edu.theory.published_runs import load, predicted_metric


def _loss(runs, fitted: dict) -> float:
    """Σ log²(predicted / reported), each paper's rows weighing one paper in all (Table 1's ten rows are one source)."""
    papers = [run.source.split(",")[0] for run in runs]
    return sum(math.log(predicted_metric(run, fitted) / run.reported) ** 2 / papers.count(paper)
               for run, paper in zip(runs, papers))


def _search(f, lo: float, hi: float, steps: int = 40) -> float:
    """The minimum of a unimodal f on [lo, hi] by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    a, b = lo, hi
    for _ in range(steps):
        c, d = b - g * (b - a), a + g * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


# Physical ranges the search stays in: a layer launches about 20 kernels of ~10 µs each (≤ 200 µs a pass);
# NCCL's bus bandwidth reaches 30–90 % of a link's datasheet rate (nccl-tests on DGX A100/H100).
BOUNDS = {"half_width": (0.0, 2048.0), "layer_overhead_s": (0.0, 2e-4), "link": (0.3, 0.9), "overlap_cost": (0.0, 0.5)}


def fit(runs=None, rounds: int = 4) -> dict:
    """Fit η_max per device and the shared terms on the training rows (coordinate search on Σ log² residuals)."""
    runs = [r for r in (runs or load()) if r.split == "train"]
    devices = sorted({SAME_CHIP.get(r.device, r.device) for r in runs})
    fitted = {"shared": {"half_width": 256.0, "layer_overhead_s": 1e-4, "link": 0.7, "overlap_cost": 0.1},
              "matmul_max": {d: 0.7 for d in devices}, "residuals": {}}

    def with_(group, key, value):
        return {**fitted, group: {**fitted[group], key: value}}

    for _ in range(rounds):
        for d in devices:
            mine = [r for r in runs if SAME_CHIP.get(r.device, r.device) == d]
            fitted = with_("matmul_max", d, _search(lambda v: _loss(mine, with_("matmul_max", d, v)), 0.2, 1.0))
        for key, (lo, hi) in BOUNDS.items():
            fitted = with_("shared", key, _search(lambda v: _loss(runs, with_("shared", key, v)), lo, hi))
    rounded = {"shared": {k: float(f"{v:.4g}") for k, v in fitted["shared"].items()},
               "matmul_max": {k: round(v, 4) for k, v in fitted["matmul_max"].items()}, "residuals": {}}
    rounded["residuals"] = {r.run: round(math.log(predicted_metric(r, rounded) / r.reported), 4) for r in runs}
    return rounded


if __name__ == "__main__":   # print the fit, to paste into FITTED
    import pprint
    pprint.pprint(fit(), sort_dicts=False, width=116)
