"""What a device achieves of its datasheet: a few efficiency terms, fitted once on published runs, with residuals.

    terms("a100-80gb").matmul(2304)     # the fraction of peak a matmul 2304 columns wide reaches on an A100

The step-time model (`theory.step_time`) charges FLOPs at peak × **matmul efficiency** η(w) = η_max · w/(w + w½),
w the narrow side of the product on one GPU (h/tp for a layer's weights, the head width for attention's scores):
small matrices leave the tensor cores idle (the roofline, `theory.efficiency`, and kernel tails). **η_max** is
the device's *measured* matmul ceiling (`MAMF`: stas00/ml-engineering's maximum achievable matmul FLOPS) times
one **stack** factor shared by every device and framework: everything per FLOP the model does not name (kernels
other than the largest GEMM shapes, launches between them, the framework's own work). A **per-layer overhead**
(seconds per layer and pass: launches, hooks, synchronisation) and an **overlap cost** (what overlapped
communication still takes from the compute beside it: SMs and HBM bandwidth) complete it. The links are not
fitted: `theory.network` takes NCCL's measured bus bandwidth.

The four terms are fitted on every complete row of `theory.published_runs` (`calibration_fit.fit`, each source
weighing one); `FITTED` is its stored result, and a test checks that the two agree. The bounds the search keeps
to are set by hand (`calibration_fit.BOUNDS`), and a term on its bound is chosen, not fitted: the test names
those. **Assumed, not fitted**: one stack factor for Megatron-LM 2021, DeepSpeed 2022, llm-foundry 2023 and
Llama 3's 2024 stack alike (their residuals show how far each differs, `calibration_fit.cross_validate`); the
FlashAttention kernel rates below; the link efficiencies.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partrain_edu.theory.network import EFFICIENCY

# a device without its own measurement borrows the one of the same chip
SAME_CHIP = {"a100-40gb": "a100-80gb", "h800": "h100-sxm", "h100-pcie": "h100-sxm", "h100-nvl": "h100-sxm",
             "h100-hbm2e-96gb": "h100-sxm", "h200": "h100-sxm"}
# Maximum achievable matmul FLOP/s over the datasheet peak, bf16 (stas00/ml-engineering, compute/accelerator/
# README.md, "Maximum Achievable Matmul FLOPS comparison table": A100 SXM 271.2 of 312, H100 SXM 794.5 of 989, "H200
# is the same"). The V100 was never measured there: it takes the mean of the two (an assumption, named).
MEASURED = {"a100-80gb": 271.2 / 312, "h100-sxm": 794.5 / 989}
MAMF = MEASURED | {"v100-32gb": sum(MEASURED.values()) / len(MEASURED)}
# The fraction of peak FlashAttention-2's causal forward + backward reaches, head width 128, long sequences (Dao
# 2023, arXiv 2307.08691, Fig. 4–6 and §4.1: "50-73% of the theoretical maximum FLOPs/s on A100", "up to 335
# TFLOPs/s on H100"). A measured kernel rate, not fitted. FlashAttention (1) runs at half of it: "around 2×
# speedup compared to FlashAttention", which reached "only 25-40%" (the same paper's abstract and §1).
# FlashAttention-3 on Hopper is "1.5-2.0× faster than FlashAttention-2" (Shah et al. 2024, abstract): the lower end.
FLASH_FRACTION = {"v100-32gb": 0.5, "a100-80gb": 0.6, "h100-sxm": 335 / 989}
FLASH_SPEED = {"flash1": 0.5, "flash2": 1.0, "flash3": 1.5}          # relative to FlashAttention-2
HOPPER = ("h100-sxm",)


def flash_fraction(device, attention: str = "flash2") -> float:
    """The fraction of peak a FlashAttention kernel (`layout.ATTENTION`) reaches on this device (a
    `hardware.Device`); FlashAttention-3 runs as FlashAttention-2 off Hopper."""
    from partrain_edu.theory.hardware import PRESETS
    name = next(k for k, d in PRESETS.items() if d == device)
    chip = SAME_CHIP.get(name, name)
    speed = 1.0 if attention == "flash3" and chip not in HOPPER else FLASH_SPEED[attention]
    return FLASH_FRACTION[chip] * speed


@dataclass(frozen=True)
class Efficiency:
    matmul_max: float          # η_max: MAMF × stack, the fraction of peak large matmuls reach in a training step
    half_width: float          # w½: the width at which a matmul reaches half of η_max
    layer_overhead_s: float    # seconds per layer per forward (a backward: twice)
    overlap_cost: float = 0.0  # the fraction of overlapped communication that still slows the compute beside it
    # the share of each link's rate NCCL reaches: measured, not fitted (`network.EFFICIENCY`; `network.DATASHEET`
    # prices the links at their datasheet rates)
    links: dict[str, float] = field(default_factory=lambda: EFFICIENCY)

    def matmul(self, width: float) -> float:
        return self.matmul_max * width / (width + self.half_width)


# Written by `python -m partrain_edu.theory.calibration_fit` from fit(). Do not edit by hand:
# tests/test_theory_estimate.py refits and compares.
FITTED = {'shared': {'stack': 0.7943, 'half_width': 306.6, 'layer_overhead_s': 0.0007688, 'overlap_cost': 0.25}}


def terms(device: str, fitted: dict | None = None) -> Efficiency:
    """The efficiency terms of a device preset (`hardware.PRESETS` key)."""
    shared = dict((fitted or FITTED)["shared"])
    chip = SAME_CHIP.get(device, device)
    if chip not in MAMF:
        raise ValueError(f"no matmul ceiling for device {device!r} (known: {', '.join(MAMF)})")
    return Efficiency(MAMF[chip] * shared.pop("stack"), **shared)
