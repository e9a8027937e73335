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
rows per device to tell them apart. `calibration_fit.fit()` redoes the fit (coordinate search on log residuals,
a second here); `FITTED` is its stored result, and a test checks that the two agree. Nothing here is tuned by hand.
"""
from __future__ import annotations

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


# Written by `python -m partrain_edu.theory.calibration_fit` from fit(); the residuals are each training row's
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
