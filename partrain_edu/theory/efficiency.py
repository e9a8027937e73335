"""FLOPs per token, MFU and HFU, arithmetic intensity and the roofline, and each parallel axis's comm/compute ratio.

    flops_per_token(GPT_1_3B, vocab=50257)                 # 72lh² + 12lsh + 6hV   (no recompute)
    roofline_seconds(matmul_flops(2048, 2048, 2048), matmul_bytes(2048, 2048, 2048), DEVICES["h100"])
    axis_ratios(layers=24, hidden=2048, seq=2048, vocab=50257, micro_batch=1, n=8)   # {axis: AxisCost}

**FLOPs per token** (Narayanan et al. 2021, §5.1; 2 FLOPs per multiply-add; backward = 2 × forward): a layer's
forward is `hardware.layer_forward_flops` = 24h² + 4sh per token, so a step costs 72lh² + 12lsh + 6hV per token:
the layers' matrices (≈ 6Ψ, Kaplan et al. 2020), attention's QKᵀ and A·V over the full s×s (12lsh), the logits
(6hV). Full recompute runs each layer's forward once more (4 passes: 96lh² + 16lsh ≈ 8Ψ); selective recompute
(Korthikanti et al. 2022) only attention's s×s part (+4lsh). **MFU** divides the model's FLOPs per second by the
devices' peak; **HFU** counts the recomputed ones too (Chowdhery et al. 2022, App. B). **Roofline** (Williams et
al. 2009): F FLOPs that move B bytes take at least max(F/peak, B/HBM bandwidth); compute-bound when the intensity
F/B passes the ridge point peak/bandwidth. **Comm/compute per axis** (Austin et al. 2025, "How to Scale Your
Model"): one step's collectives (`traffic.step_traffic`, `traffic.collective_time`) over the device's share of the
FLOPs at peak; below 1 the communication can hide behind compute. Pure Python: no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.theory.hardware import DEVICES, Device, ModelShape, layer_forward_flops
from partrain_edu.theory.memory import gpt_param_count
from partrain_edu.theory.network import group_seconds
from partrain_edu.theory.traffic import LATENCY, LINKS, collective_time, step_traffic

RECOMPUTE = ("none", "selective", "full")
AXES = ("dp", "fsdp", "tp", "pp", "cp")
# The link each axis usually crosses: TP and CP inside a node (NVLink), the others between nodes.
DEFAULT_LINKS = {"dp": "infiniband", "fsdp": "infiniband", "tp": "nvlink", "pp": "infiniband", "cp": "nvlink"}


def _positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def kaplan_flops_per_token(params: int | float, recompute: bool = False) -> float:
    """6Ψ (Kaplan et al. 2020: 2Ψ forward, 4Ψ backward); with full recompute 8Ψ (one forward more)."""
    _positive(params=params)
    return (8 if recompute else 6) * params


def flops_per_token(shape: ModelShape, vocab: int, recompute: str = "none") -> float:
    """A training step's FLOPs per token (Narayanan et al. 2021, §5.1): 3 passes of every layer's forward
    (`hardware.layer_forward_flops`) + the logits' 6hV; recompute adds a 4th forward of the layers ("full") or of
    attention's s×s products ("selective"). ``vocab=0`` leaves out the logits (what the emulated device charges)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    _positive(layers=shape.layers, hidden=shape.hidden, seq=shape.seq)
    if isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 0:
        raise ValueError(f"vocab must be a whole number ≥ 0, got {vocab!r}")
    layer = layer_forward_flops(shape, 1) / shape.seq             # 24h² + 4sh per token
    scores = 4 * shape.seq * shape.hidden                          # the s×s part of it: QKᵀ and A·V
    passes = 3 * layer + {"none": 0, "selective": scores, "full": layer}[recompute]
    return shape.layers * passes + 6 * shape.hidden * vocab


def utilization(flops_per_token_: float, tokens_per_second: float, devices: int, peak_flops: float) -> float:
    """FLOPs per second achieved over the devices' peak. MFU with the model's FLOPs per token (recompute="none"),
    HFU with those the hardware ran (the recompute included) — Chowdhery et al. 2022, App. B."""
    _positive(flops_per_token=flops_per_token_, tokens_per_second=tokens_per_second, devices=devices,
              peak_flops=peak_flops)
    return flops_per_token_ * tokens_per_second / (devices * peak_flops)


def matmul_flops(m: int, k: int, n: int) -> int:
    """(m×k)·(k×n): m·n dot products of length k, 2 FLOPs per multiply-add."""
    _positive(m=m, k=k, n=n)
    return 2 * m * k * n


def matmul_bytes(m: int, k: int, n: int, bytes_per_element: int = 2) -> int:
    """The least HBM traffic of (m×k)·(k×n): read both operands once, write the m×n result once."""
    _positive(m=m, k=k, n=n, bytes_per_element=bytes_per_element)
    return (m * k + k * n + m * n) * bytes_per_element


def arithmetic_intensity(m: int, k: int, n: int, bytes_per_element: int = 2) -> float:
    """FLOPs per byte moved of (m×k)·(k×n); for m tokens through a k×n weight with m ≪ k, n: about 2m/bytes."""
    return matmul_flops(m, k, n) / matmul_bytes(m, k, n, bytes_per_element)


def ridge_point(device: Device) -> float:
    """The intensity (FLOPs/byte) above which `device` is compute-bound: peak / HBM bandwidth."""
    return device.peak_flops / device.hbm


def attainable_flops(intensity: float, device: Device) -> float:
    """The roof: min(peak, intensity × bandwidth) FLOP/s."""
    _positive(intensity=intensity)
    return min(device.peak_flops, intensity * device.hbm)


def roofline_seconds(flops: float, nbytes: float, device: Device) -> float:
    """The least time a kernel of `flops` FLOPs moving `nbytes` bytes takes: max(F/peak, B/bandwidth)."""
    _positive(flops=flops, nbytes=nbytes)
    return max(flops / device.peak_flops, nbytes / device.hbm)


@dataclass(frozen=True)
class AxisCost:
    """One step of one device along one parallel axis of size n."""
    axis: str
    n: int
    link: str
    bytes_sent: int          # what the busiest rank sends (traffic.step_traffic)
    comm_s: float            # α–β time of those collectives on the link
    compute_s: float         # the device's share of the step's model FLOPs at peak

    @property
    def ratio(self) -> float:
        return self.comm_s / self.compute_s


def axis_cost(axis: str, n: int, *, layers: int, hidden: int, seq: int, vocab: int, micro_batch: int,
              microbatches: int = 1, link: str | None = None, device: Device | str = "h100",
              bytes_per_element: int = 2, logits: bool = True, per_node: int | None = None) -> AxisCost:
    """Comm and compute seconds of one step on one device when only `axis` has size n (the others 1).

    Each device computes m micro-batches of b sequences; dp and fsdp run the whole model on them, tp, pp and cp
    a 1/n share (its matrices' columns, its stage's layers, its piece of the sequence). logits=False leaves the
    head's FLOPs out of the compute, as the emulated device does. The link is one GPU's own, at its datasheet
    rate; `per_node` (the group's members on each node) prices the group as the calibrated model does instead
    (`theory.network`: NVLink inside a node, the members' NICs across, at NCCL's measured efficiency)."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(AXES)}, got {axis!r}")
    if axis == "pp" and n > layers:
        raise ValueError(f"a pipeline of {n} stages needs at least {n} layers, got {layers}; pick n ≤ layers")
    device = DEVICES[device] if isinstance(device, str) else device
    link = link or DEFAULT_LINKS[axis]
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    shape = ModelShape("", layers, hidden, seq)
    tokens = microbatches * micro_batch * seq
    share = 1 if axis in ("dp", "fsdp") else n
    compute_s = tokens * flops_per_token(shape, vocab if logits else 0) / device.peak_flops / share
    kw = dict(microbatches=microbatches, bytes_per_element=bytes_per_element)
    shape_kw = dict(hidden=hidden, seq=seq, micro_batch=micro_batch, **kw)
    if axis in ("dp", "fsdp"):
        calls = step_traffic("ddp" if axis == "dp" else "zero3", gpt_param_count(layers, hidden, vocab, seq),
                             dp=n, **kw).collectives
    elif axis == "tp":
        calls = step_traffic("tp", tp=n, layers=layers, **shape_kw).collectives
    elif axis == "pp":
        calls = step_traffic("pp", pp=n, **shape_kw).collectives
    else:  # cp: the ring's K, V sends (and their gradients'), not the gradient all-reduce: as for tp and pp
        calls = step_traffic("cp", cp=n, layers=layers, **shape_kw).collectives if n > 1 else []
    # the device's own links where it has them (an A100's NVLink is slower than traffic.LINKS' H100 one)
    beta = {"nvlink": device.nvlink, "infiniband": device.nic}.get(link, LINKS[link])
    if per_node is not None:
        network = "infiniband" if link == "nvlink" else link
        link = "nvlink" if per_node >= n else network
        comm_s = sum(c.count * group_seconds(c.op, c.bytes_per_call, c.group_size, min(per_node, c.group_size),
                                             device, network) for c in calls)
    else:
        comm_s = sum(c.count * collective_time(c.op, c.bytes_per_call, c.group_size, alpha=LATENCY[link], beta=beta)
                     for c in calls)
    return AxisCost(axis, n, link, sum(c.bytes_sent for c in calls), comm_s, compute_s)


def axis_ratios(n: int = 8, links: dict[str, str] | None = None, **sizes) -> dict[str, AxisCost]:
    """{axis: AxisCost} for every axis at size n; `links` overrides DEFAULT_LINKS; `sizes` as axis_cost's."""
    links = {**DEFAULT_LINKS, **(links or {})}
    return {axis: axis_cost(axis, n, link=links[axis], **sizes) for axis in AXES}


def ratio_table(costs: dict[str, AxisCost]) -> str:
    """One line per axis: its size, link, bytes sent, comm and compute time, the ratio and what it means."""
    lines = [f"{'axis':<5}{'n':>4}  {'link':<11}{'sent':>10}{'comm':>11}{'compute':>11}{'comm/compute':>14}"]
    for c in costs.values():
        verdict = "hides behind compute" if c.ratio < 1 else "communication-bound"
        lines.append(f"{c.axis:<5}{c.n:>4}  {c.link:<11}{c.bytes_sent / 1e6:>7.1f} MB{c.comm_s:>9.3g} s"
                     f"{c.compute_s:>9.3g} s{c.ratio:>14.3g}  {verdict}")
    return "\n".join(lines)
