"""The devices and links the emulated device (`partrain_edu.emulated`) pretends to be, and what a layer costs.

    a100 = DEVICES["a100"]; layer_seconds(GPT_1_3B, tokens=2048, device=a100)   # one layer's forward

**Devices** (vendor datasheets, SXM parts): peak dense bf16 FLOP/s, memory, NVLink bandwidth each way, the NIC
bandwidth per GPU, and HBM bandwidth (the roofline's slope, `theory.efficiency`). **Links** follow Hockney's α–β
model (Hockney 1994): a message of S bytes costs α + S/β; β are `traffic.LINKS`; α are `traffic.LATENCY` (orders
of magnitude — fit this machine's with `benchmarks/alpha_beta.py`). **A layer's forward** of a GPT of hidden size
h over B·s tokens costs 24·B·s·h² + 4·B·s²·h FLOPs (Narayanan et al. 2021, §5.1: the four h×h-sized projections
of attention and the two 4h MLP matmuls, 2 FLOPs per multiply-add, plus the s×s attention scores); backward
costs twice that. Pure Python: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float      # dense bf16 FLOP/s
    memory_bytes: float
    nvlink: float          # bytes/s each way to another GPU of the node
    nic: float             # bytes/s each way off the node, per GPU
    source: str
    hbm: float             # bytes/s between HBM and the chip: the roofline's slope (Williams et al. 2009)


DEVICES = {
    # A100 SXM4 80GB datasheet: 312 TFLOP/s bf16 dense; NVLink 3: 600 GB/s total = 300 GB/s each way;
    # DGX A100: one 200 Gb/s HDR InfiniBand port per GPU = 25 GB/s; HBM2e: 2,039 GB/s.
    "a100": Device("A100 SXM 80GB", 312e12, 80e9, 300e9, 25e9, "NVIDIA A100 datasheet; DGX A100 user guide",
                   hbm=2039e9),
    # H100 SXM5 datasheet: 989 TFLOP/s bf16 dense (1979 with sparsity); NVLink 4: 900 GB/s = 450 GB/s each way;
    # DGX H100: one 400 Gb/s NDR port per GPU = 50 GB/s; HBM3: 3.35 TB/s.
    "h100": Device("H100 SXM 80GB", 989e12, 80e9, 450e9, 50e9, "NVIDIA H100 datasheet; DGX H100 user guide",
                   hbm=3.35e12),
}


@dataclass(frozen=True)
class ModelShape:
    """The transformer whose costs an emulated run charges (its arithmetic is TinyGPT's)."""
    name: str
    layers: int
    hidden: int
    seq: int


# GPT-3 XL (Brown et al. 2020, Table 2.1): 24 layers, d_model 2048, context 2048, 1.3B parameters.
GPT_1_3B = ModelShape("GPT-3 XL (1.3B)", layers=24, hidden=2048, seq=2048)
SHAPES = {"gpt-1.3b": GPT_1_3B}


def layer_forward_flops(shape: ModelShape, samples: int) -> float:
    """FLOPs of one transformer layer's forward over `samples` sequences: 24·B·s·h² + 4·B·s²·h."""
    b, s, h = samples, shape.seq, shape.hidden
    return 24 * b * s * h * h + 4 * b * s * s * h


def layer_seconds(shape: ModelShape, samples: int, device: Device) -> float:
    """Seconds of one layer's forward at the device's peak (backward: twice this)."""
    return layer_forward_flops(shape, samples) / device.peak_flops


def device_named(name: str) -> Device:
    if name not in DEVICES:
        raise ValueError(f"unknown emulated device {name!r}: use one of {', '.join(DEVICES)}")
    return DEVICES[name]
