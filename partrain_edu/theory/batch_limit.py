"""Why 2D (二维并行): the global batch caps the data-parallel degree; FSDP needs tokens per GPU, whatever tp.

    max_dp_for_batch(1024, 1)  → 1024;   min_tp_for_batch(gpus=4096, global_batch=1024) → 4
    fsdp_tokens_per_gpu("h100-sxm")  → ≈ 2,680 tokens per GPU, the same for tp = 1, 2, 4, 8 (±4 %)

**Out of batch.** A step's global batch B (sequences) is bounded — the steps to a given loss follow
S = S_min·(1+B_noise/B), so past the critical batch size a bigger batch buys little: the steps fall slowly while the
tokens per step double (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"; Kaplan et al. 2020) —
and each of n data-parallel replicas needs at least b_min sequences: n ≤ ⌊B / b_min⌋. On G GPUs the rest must be
model parallel: tp ≥ G·b_min / B. **Out of intensity** (Austin et al. 2025, "How to Scale Your Model", §5): a
replica of t tokens computes 6Ψ·t FLOPs and, under FSDP, sends 3(n−1)/n·Ψ·e bytes (`traffic` "zero3"): its
arithmetic intensity 2t·n/((n−1)·e) FLOPs per byte — ≈ t in bf16 — must reach F/β (C/W) to hide its traffic:
t ≳ (e/2)·F/β tokens, whatever Ψ. F is the FLOP/s the GPU sustains and β the bytes/s **the group's ring** gives
each member (`network.group_link`): across nodes, k members per node share k NICs, β = min(NVLink, k·NIC). Under
tp a replica spans tp GPUs and its dp group has k = 8/tp members per node: tp× the tokens per replica on 1/tp of
the egress, so **the tokens per GPU, (e/2)·F/(tp·β), do not depend on tp** (`fsdp_tokens_per_gpu`; the Scaling
Book's GPU chapter: "about 2500 tokens per GPU"). 2D does not make FSDP compute-bound; what it buys is fewer
replicas for a bounded batch, and fewer ring steps. The same rule with k·Ψ·e bytes per step instead of 3Ψe reads
t ≳ (k·e/6)·F/β: k = 2 for DDP's all-reduce. The exact, per-pass bound on n (exercise 13,
`exercises/13_communication_bounds.ipynb`) is left to the learner.
Pure Python: no torch.
"""
from __future__ import annotations

from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.network import group_link
from partrain_edu.theory.traffic import step_traffic


def _positive(**values) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")


def max_dp_for_batch(global_batch: int, min_per_replica: int = 1) -> int:
    """The most data-parallel replicas a global batch of `global_batch` sequences feeds, each at least
    `min_per_replica` sequences: ⌊B / b_min⌋ (0: the batch cannot feed even one)."""
    _positive(global_batch=global_batch, min_per_replica=min_per_replica)
    return int(global_batch // min_per_replica)


def min_tp_for_batch(gpus: int, global_batch: int, min_per_replica: int = 1, max_tp: int = 8) -> int:
    """The smallest model-parallel degree (a divisor of `gpus`, at most `max_tp`: one node's NVLink) that leaves
    no more data-parallel replicas, gpus / tp, than the batch feeds; a ValueError naming the fix if none does."""
    _positive(gpus=gpus, max_tp=max_tp)
    most = max_dp_for_batch(global_batch, min_per_replica)
    for tp in range(1, max_tp + 1):
        if gpus % tp == 0 and gpus // tp <= most:
            return tp
    raise ValueError(f"{gpus} GPUs need more than tp={max_tp} for a batch of {global_batch} sequences "
                     f"(at most {most} replicas of {min_per_replica}): add pipeline stages or a bigger batch")


def fsdp_intensity(params: int, tokens_per_replica: float, dp: int, tp: int = 1, bytes_per_element: int = 2) -> float:
    """FLOPs per byte one GPU of a dp × tp grid computes and sends under FSDP in a step: 6·(Ψ/tp)·t FLOPs
    (t tokens per replica, tp GPUs share them) over `traffic.step_traffic("zero3", …)`'s bytes (dp > 1). Compare it
    with F/β where β is what the dp group's ring gives each member (`network.group_link`), not one NIC."""
    _positive(params=params, tokens_per_replica=tokens_per_replica, dp=dp, tp=tp)
    if dp < 2:
        raise ValueError("one replica sends nothing along dp: its intensity is unbounded; pass dp >= 2")
    sent = step_traffic("zero3", params, dp=dp, tp=tp, bytes_per_element=bytes_per_element).per_rank_bytes_sent
    return 6 * params / tp * tokens_per_replica / sent


def hardware_intensity(flops: float, bandwidth: float) -> float:
    """FLOPs a GPU computes in the time its link sends one byte, F/β (Austin et al.'s C/W): the intensity a
    step needs to hide its traffic behind compute."""
    _positive(flops=flops, bandwidth=bandwidth)
    return flops / bandwidth


def critical_tokens(flops: float, bandwidth: float, bytes_per_element: int = 2) -> float:
    """Tokens per replica from which FSDP's whole step hides its traffic, in the many-replica limit
    ((n−1)/n → 1): (e/2)·F/β, independent of Ψ. `flops` is what the GPU sustains: its peak gives the most tokens
    a replica could need, a calibrated rate (`calibration.terms`) what it needs in practice; `bandwidth` is what
    the dp group's ring gives each member (`network.group_link`), which depends on its members per node."""
    _positive(bytes_per_element=bytes_per_element)
    return bytes_per_element / 2 * hardware_intensity(flops, bandwidth)


def fsdp_tokens_per_gpu(device, tp: int = 1, gpus_per_node: int = 8, flops: float | None = None,
                        bytes_per_element: int = 2, network: str = "infiniband", nic: float | None = None) -> float:
    """Tokens **per GPU** from which FSDP across whole nodes hides its traffic (many replicas), for a dp × tp grid
    with tp inside each node of `gpus_per_node` GPUs of `device` (a `hardware.Device` or its name):

        t_GPU = critical_tokens(F, β_dp) / tp = (e/2) · F / (tp · β_dp),
        β_dp = `network.group_link`(device, members, k).beta = min(NVLink·η_NVLink, k·NIC·η_net),  k = node / tp

    — a replica spans tp GPUs and its dp group has k members on each node, so it crosses the network on k NICs.
    While k·NIC is below NVLink, tp·β_dp = node·NIC·η_net, the node's egress, and t_GPU is the same for every tp.
    At an H100's peak: 989e12 / (8 × 50e9) ≈ 2,473 at the datasheet NICs, ≈ 2,576 at NCCL's η_net = 0.96,
    ≈ 2,680 at tp = 1 where NVLink (369 GB/s achieved) caps the 8 NICs (384). Sources: Austin et al. 2025, "How to Scale
    Your Model", GPU chapter ("beyond the node level, the cost of an AllGather or ReduceScatter on B bytes is
    roughly B / W_node egress"; FSDP "requires a local batch size of about 2500 tokens per GPU"; tp = 8 "reduce[s]
    the cost of the node-level reduction by 8 but leave[s] the overall cost the same"); NVIDIA/nccl #1576 (192 GB/s
    all-reduce bus bandwidth between DGX A100 nodes of 8 × 200 Gb/s NICs). `flops` defaults to the peak."""
    device = device_named(device) if isinstance(device, str) else device
    beta = dp_bandwidth(device, tp, gpus_per_node, network=network, nic=nic)
    return critical_tokens(device.peak_flops if flops is None else flops, beta, bytes_per_element) / tp


def dp_bandwidth(device, tp: int = 1, gpus_per_node: int = 8, gpus: int | None = None,
                 network: str = "infiniband", nic: float | None = None) -> float:
    """β each member of FSDP's dp group gets (`network.group_link`) on a grid of `gpus` GPUs of `device` (a
    `hardware.Device` or its name) with tp inside each node: gpus/tp members, node/tp of them per node (all of them
    when one node holds the grid); `gpus` None: any group that crosses nodes (two nodes' worth)."""
    device = device_named(device) if isinstance(device, str) else device
    for name, value in (("tp", tp), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    if gpus_per_node % tp:
        raise ValueError(f"tp must divide the {gpus_per_node} GPUs of a node, got tp={tp}")
    per_node = gpus_per_node // tp
    members = 2 * per_node if gpus is None else gpus // tp
    return group_link(device, members, min(members, per_node), network, nic).beta
