"""The devices real runs use and the emulated device (`partrain_edu.emulated`) pretends to be; what a layer costs.

    a100 = device_named("a100-80gb"); layer_seconds(GPT_1_3B, tokens=2048, device=a100)   # one layer at peak

**Devices** (`PRESETS`, vendor datasheets, SXM parts): peak dense bf16 (V100: fp16) FLOP/s, memory, NVLink
bandwidth each way, the NIC bandwidth per GPU, and HBM bandwidth (the roofline's slope, `theory.efficiency`); what
they achieve of it is fitted on published runs (`theory.calibration`). **Links** follow Hockney's α–β
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


# HBM sizes on datasheets are binary: an "80GB" A100 reports 81920 MiB (nvidia-smi), 80 GiB = 85.9e9 bytes.
GIB = 2**30
PRESETS = {
    # V100 SXM2/SXM3 32GB datasheet: 125 TFLOP/s fp16 tensor cores (no bf16); NVLink 2: 300 GB/s total = 150 each
    # way; HBM2 900 GB/s. DGX-2H (Shoeybi et al. 2019, §5): 16 GPUs, 8 InfiniBand adapters, 100 GB/s per node.
    "v100-32gb": Device("V100 SXM 32GB", 125e12, 32 * GIB, 150e9, 100e9 / 16, "NVIDIA V100 datasheet; "
                        "Shoeybi et al. 2019 §5 (DGX-2H)", hbm=900e9),
    # A100 SXM4 datasheet: 312 TFLOP/s bf16 dense; NVLink 3: 600 GB/s total = 300 GB/s each way;
    # DGX A100: one 200 Gb/s HDR InfiniBand port per GPU = 25 GB/s; HBM2 1,555 GB/s (40GB), HBM2e 2,039 GB/s (80GB).
    "a100-40gb": Device("A100 SXM 40GB", 312e12, 40 * GIB, 300e9, 25e9, "NVIDIA A100 datasheet; DGX A100 user guide",
                        hbm=1555e9),
    "a100-80gb": Device("A100 SXM 80GB", 312e12, 80 * GIB, 300e9, 25e9, "NVIDIA A100 datasheet; DGX A100 user guide",
                        hbm=2039e9),
    # H100 SXM5 datasheet: 989 TFLOP/s bf16 dense (1979 with sparsity); NVLink 4: 900 GB/s = 450 GB/s each way;
    # DGX H100: one 400 Gb/s NDR port per GPU = 50 GB/s; HBM3: 3.35 TB/s.
    "h100-sxm": Device("H100 SXM 80GB", 989e12, 80 * GIB, 450e9, 50e9, "NVIDIA H100 datasheet; DGX H100 user guide",
                       hbm=3.35e12),
    # H800 SXM: H100's chip and memory, NVLink cut to 400 GB/s total = 200 each way (export version); 400 Gb/s IB
    # per GPU (DeepSeek-AI 2024, DeepSeek-V3 report §3.1–3.2: "NVLink 160 GB/s" achieved, "IB 50 GB/s").
    "h800": Device("H800 SXM 80GB", 989e12, 80 * GIB, 200e9, 50e9, "NVIDIA H800 product brief; DeepSeek-V3 report §3",
                   hbm=3.35e12),
    # H100 PCIe: 1,513 TFLOP/s bf16 with sparsity = 756 dense, 80 GB, 2.0 TB/s (H100 PCIe product brief PB-11133-001);
    # no NVSwitch: GPUs of a server talk over PCIe Gen5, 128 GB/s = 64 each way (an NVLink bridge joins pairs only).
    "h100-pcie": Device("H100 PCIe 80GB", 756e12, 80 * GIB, 64e9, 50e9, "NVIDIA H100 PCIe product brief PB-11133-001",
                        hbm=2.0e12),
    # H100 NVL: 1,671 sparse = 835 dense, 94 GB HBM3, 3.9 TB/s, 350-400 W; pairs bridged by NVLink (600 GB/s), else
    # PCIe Gen5 (NVIDIA H100 datasheet, the "H100 SXM | H100 NVL" table): one server's GPUs priced at PCIe's 64 GB/s.
    "h100-nvl": Device("H100 NVL 94GB", 835e12, 94e9, 64e9, 50e9, "NVIDIA H100 datasheet (H100 NVL column)",
                       hbm=3.9e12),
    # H100 SXM with 96 GB of HBM2e at 2.4 TB/s, run at a 500 W power limit (Meta's Grand Teton, torchtitan's
    # benchmarks/llama3_h100_202412_torchtitan.md: its peak "between SXM and NVL"): NVL's 835 dense TFLOP/s, the
    # lower end, stands in for the capped clock (no published GEMM rate at 500 W); NVLink 4 and a NIC as DGX H100.
    "h100-hbm2e-96gb": Device("H100 SXM 96GB HBM2e, 500 W", 835e12, 96e9, 450e9, 50e9,
                              "torchtitan benchmarks/llama3_h100_202412_torchtitan.md; NVIDIA H100 datasheet",
                              hbm=2.4e12),
    # H200 SXM: H100's chip and clocks (989 dense), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s (NVIDIA H200 datasheet).
    "h200": Device("H200 SXM 141GB", 989e12, 141e9, 450e9, 50e9, "NVIDIA H200 datasheet; DGX H200 user guide",
                   hbm=4.8e12),
}
# the short names the emulated device, the widgets and the exercises use (`emulated:a100`); `device_named` takes both
ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm"}
DEVICES = {alias: PRESETS[name] for alias, name in ALIASES.items()}


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
    b = samples
    s = shape.seq
    h = shape.hidden
    return 24 * b * s * h * h + 4 * b * s * s * h


def layer_seconds(shape: ModelShape, samples: int, device: Device) -> float:
    """Seconds of one layer's forward at the device's peak (backward: twice this)."""
    return layer_forward_flops(shape, samples) / device.peak_flops


def device_named(name: str) -> Device:
    if name not in PRESETS and name not in ALIASES:
        raise ValueError(f"unknown device {name!r}: use one of {', '.join(PRESETS)} (or {', '.join(ALIASES)})")
    return PRESETS[ALIASES.get(name, name)]


def canonical(name: str) -> str:
    """The preset's full key: "a100" → "a100-80gb" (one-line error for an unknown name)."""
    device_named(name)
    return ALIASES.get(name, name)
