"""What a device achieves of its datasheet: a few efficiency terms, fitted once on published runs, with residuals.

    terms("a100-80gb").matmul(2304)     # the fraction of peak a matmul 2304 columns wide reaches on an A100

The step-time model (`theory.step_time`) charges FLOPs at peak × **matmul efficiency** η(w) = η_max · w/(w + w½),
w the narrow side of the product on one GPU (h/tp for a layer's weights, the head width for attention's scores):
small matrices leave the tensor cores idle (the roofline, `theory.efficiency`, and kernel tails). A **per-layer
overhead** (seconds per layer and pass: launches, synchronisation) and a **link efficiency** (the fraction of a
link's datasheet bandwidth NCCL achieves) and an **overlap cost** (what overlapped communication still takes from
the compute beside it: SMs and HBM bandwidth) complete it. η_max is fitted per device on the training rows of
`theory.published_runs` (a device without its own rows takes its chip's: the A100 40GB the 80GB's, the H800 the
H100's); w½, the overhead and the link efficiency are shared by all devices, since the training set has too few
rows per device to tell them apart. `fit()` redoes the fit (coordinate search on log residuals, a second here);
`FITTED` is its stored result, and a test checks that the two agree. Nothing here is tuned by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# a device without training rows borrows the terms of the one with the same chip
SAME_CHIP = {"a100-40gb": "a100-80gb", "h800": "h100-sxm"}
# The fraction of peak FlashAttention-2's causal forward + backward reaches, head width 128, long sequences (Dao
# 2023, arXiv 2307.08691, Fig. 4–6 and §4.1: "50-73% of the theoretical maximum FLOPs/s on A100", "up to 335
# TFLOPs/s on H100"). A measured kernel rate, not fitted: no training row has sequences long enough to tell.
FLASH_FRACTION = {"v100-32gb": 0.5, "a100-40gb": 0.6, "a100-80gb": 0.6, "h100-sxm": 335 / 989, "h800": 335 / 989}


def flash_fraction(device) -> float:
    """FlashAttention-2's achieved fraction of peak on this device (a `hardware.Device`)."""
    from partrain_edu.theory.hardware import PRESETS
    return next(FLASH_FRACTION[k] for k, d in PRESETS.items() if d == device)


@dataclass(frozen=True)
class Efficiency:
    matmul_max: float          # η_max: the fraction of peak large matmuls reach
    half_width: float          # w½: the width at which a matmul reaches half of η_max
    layer_overhead_s: float    # seconds per layer per forward (a backward: twice)
    link: float                # the fraction of datasheet link bandwidth achieved
    overlap_cost: float = 0.0  # the fraction of overlapped communication that still slows the compute beside it

    def matmul(self, width: float) -> float:
        return self.matmul_max * width / (width + self.half_width)


# Written by `python -m partrain_edu.theory.calibration` from fit(); the residuals are each training row's
# log(predicted / reported). Do not edit by hand: tests/test_theory_calibration.py refits and compares.
FITTED = {'shared': {'half_width': 128.0, 'layer_overhead_s': 0.0002, 'link': 0.9, 'overlap_cost': 0.04958},
 'matmul_max': {'a100-80gb': 0.743, 'h100-sxm': 0.6264, 'v100-32gb': 0.4936},
 'residuals': {'megatron-2021-1.7B': -0.0971,
               'megatron-2021-3.6B': -0.0911,
               'megatron-2021-7.5B': -0.1008,
               'megatron-2021-18.4B': -0.0548,
               'megatron-2021-39.1B': -0.0604,
               'megatron-2021-76.1B': -0.0045,
               'megatron-2021-145.6B': -0.0268,
               'megatron-2021-310.1B': -0.0048,
               'megatron-2021-529.6B': -0.0655,
               'megatron-2021-1008B': -0.0393,
               'llama3-405B-8192': 0.043,
               'megatron-2019-1.2B-1gpu': 0.022,
               'mpt-70b-h100-sxm-64gpu-2048': -0.0081,
               'mpt-7b-a100-80gb-8gpu-2048': 0.0626}}


def terms(device: str, fitted: dict | None = None) -> Efficiency:
    """The efficiency terms of a device preset (`hardware.PRESETS` key)."""
    fitted = fitted or FITTED
    chip = SAME_CHIP.get(device, device)
    if chip not in fitted["matmul_max"]:
        raise ValueError(f"no fitted efficiency for device {device!r}: the training set has no run on it "
                         f"(fitted: {', '.join(fitted['matmul_max'])})")
    return Efficiency(fitted["matmul_max"][chip], **fitted["shared"])


def _loss(runs, fitted: dict) -> float:
    """Σ log²(predicted / reported), each paper's rows weighing one paper in all (Table 1's ten rows are one source)."""
    from partrain_edu.theory.published_runs import predicted_metric
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
    from partrain_edu.theory.published_runs import load, predicted_metric
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
