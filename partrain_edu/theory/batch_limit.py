"""Why 2D (二维并行): the global batch caps the data-parallel degree, and FSDP needs tokens per replica.

    max_dp_for_batch(1024, 1)  → 1024;   min_tp_for_batch(gpus=4096, global_batch=1024) → 4

**Out of batch.** A step's global batch B (sequences) is bounded — the steps to a given loss follow
S = S_min·(1+B_noise/B), so past the critical batch size a bigger batch buys little: the steps fall slowly while the
tokens per step double (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training"; Kaplan et al. 2020) —
and each of n data-parallel replicas needs at least b_min sequences: n ≤ ⌊B / b_min⌋. On G GPUs the rest must be
model parallel: tp ≥ G·b_min / B. **Out of intensity** (Austin et al. 2025, "How to Scale Your Model", §5): a
replica of t tokens computes 6Ψ·t FLOPs and, under FSDP, sends 3(n−1)/n·Ψ·e bytes (`traffic` "zero3"): its
arithmetic intensity 2t·n/((n−1)·e) FLOPs per byte — ≈ t in bf16 — must reach the link's F/β (C/W) to hide its
traffic: t ≳ (e/2)·F/β tokens, whatever Ψ. F is the FLOP/s the GPU sustains and β the bytes/s its link achieves: the
datasheet's peak and link (`hardware.PRESETS`) give an upper bound on the tokens needed; the calibrated rates
(`calibration.terms(device).matmul(h)` × peak, `step_time.link_cost`) a realistic one. The same rule with k·Ψ·e
bytes per step instead of 3Ψe reads t ≳ (k·e/6)·F/β: k = 2 for DDP's all-reduce. Under tp a replica spans tp GPUs:
Ψ/tp bytes against 6Ψ/tp FLOPs per token, the same ratio, but n = G/tp replicas of tp× more tokens each: 2D keeps
FSDP compute-bound. The exact, per-pass bound on n (exercise 13, `exercises/13_communication_bounds.ipynb`) is left
to the learner.
Pure Python: no torch.
"""
from __future__ import annotations

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
    (t tokens per replica, tp GPUs share them) over `traffic.step_traffic("zero3", …)`'s bytes (dp > 1)."""
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
    ((n−1)/n → 1): (e/2)·F/β, independent of Ψ and of tp. `flops` is what the GPU sustains: its peak gives the
    most tokens a replica could need, a calibrated rate (`calibration.terms`) what it needs in practice."""
    _positive(bytes_per_element=bytes_per_element)
    return bytes_per_element / 2 * hardware_intensity(flops, bandwidth)
