"""Exercise 13: how far data parallelism, ZeRO-3 and tensor parallelism scale before they wait on the network.

Graded in-process, on plain numbers, 6 cases each: max_dp_degree, max_fsdp_degree, max_tp_degree, min_dp_batch.
The resource is time: in each pass, a collective's ring time (bytes sent / β, β one way per device, α ignored,
bf16 = 2 B; across nodes β is what the group's ring gives each member: one NIC for one member per node, the
node's 8 NICs, capped by NVLink, for 8) may not exceed the compute of the pass it overlaps (F FLOP/s; 2Ψ forward,
4Ψ backward per token).
  DP (DDP)      all-reduce 2(N−1)/N·2Ψ B ≤ backward 4ΨT/N FLOPs  ⇒  (N−1)·F ≤ T·β,  N* = 1 + ⌊Tβ/F⌋
  FSDP (ZeRO-3) all-gather (N−1)/N·2Ψ ≤ forward 2ΨT/N; all-gather + reduce-scatter ≤ backward  ⇒  the same N*
  TP (Megatron) per layer in forward, 2 all-reduces of the b·s·h bf16 activations, 2(t−1)/t·2bsh B each,
                ≤ 24bsh²/t FLOPs (backward: same bytes, twice the FLOPs)  ⇒  (t−1)·F ≤ 3hβ,  t* = 1 + ⌊3hβ/F⌋
  DP batch      B sequences of s tokens, a multiple of N, B·s·β ≥ (N−1)·F  ⇒  B = N·max(1, ⌈(N−1)F/(Nsβ)⌉)
TP's all-reduces block the next matmul: past t* even a perfect overlap (collective matmul) cannot hide them.
Ψ cancels for DP and FSDP, the tokens for TP. Austin et al. 2025, "How to Scale Your Model", §5 (DP and FSDP
compute-bound when B/X > C/W; TP bounded by the width); Rajbhandari et al. 2020, §7.2 (ZeRO-3: 1.5× DDP's bytes);
Shoeybi et al. 2019, §3 (f and g); Narayanan et al. 2021, §5.1 (24bsh² per layer forward).
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

from partrain_edu.grading.registry import register
from partrain_edu.theory.hardware import DEVICES
from partrain_edu.theory.memory import gpt_param_count
from partrain_edu.theory.network import DATASHEET, group_link

A100, H100 = DEVICES["a100"], DEVICES["h100"]
A100_NIC, A100_NVLINK = (A100.peak_flops, A100.nic), (A100.peak_flops, A100.nvlink)
H100_NIC, H100_NVLINK = (H100.peak_flops, H100.nic), (H100.peak_flops, H100.nvlink)
# A group with all 8 GPUs of each node crosses the network on the node's 8 NICs (NCCL: one ring per NIC), capped by
# NVLink: β per GPU = min(NVLink, 8 · NIC), `theory.network.group_link` at the datasheet (the givens' "8 NICs").
H100_NODES = (H100.peak_flops, group_link(H100, 16, 8, efficiency=DATASHEET).beta)
# Powers of two: every time a learner computes is then exact in floating point, so the bound is hit exactly.
EXACT = (2.0**50, 2.0**36)
PSI_7_5B = gpt_param_count(36, 4096, vocab=51200, seq=2048)  # Megatron's 7.5B, 36 × 4096 (Narayanan et al., Table 1)
M2 = 1024 * 2048  # GPT-3 6.7B's batch, 2M tokens (Brown et al. 2020, Table 2.1)

# (what the case is, arguments). The second case changes only the argument that cancels; one case has a bound
# with a fractional part above ½ (so round() fails), one hits it exactly, one answers 1.
DP_CASES = [
    ("Ψ = 1.3B, 512 × 2048 tokens per step, A100 over its 25 GB/s NIC", (1_300_000_000, 512 * 2048, *A100_NIC)),
    ("the same with Ψ = 175B", (175_000_000_000, 512 * 2048, *A100_NIC)),
    ("Ψ = 7.5B (36 × 4096), 2M tokens, whole H100 nodes over their 8 NICs", (PSI_7_5B, M2, *H100_NODES)),
    ("Ψ = 7.5B, 64 × 2048 tokens, H100 over one NIC each", (PSI_7_5B, 64 * 2048, *H100_NIC)),
    ("Ψ = 2^30, T = 2^16 tokens, F = 2^50 FLOP/s, β = 2^36 B/s", (2**30, 2**16, *EXACT)),
    ("Ψ = 350M, 4 × 2048 tokens, H100 over one NIC each", (350_000_000, 4 * 2048, *H100_NIC)),
]
FSDP_CASES = [
    ("Ψ = 13B, 1024 × 2048 tokens per step, A100 over its 25 GB/s NIC", (13_000_000_000, M2, *A100_NIC)),
    ("the same with Ψ = 1.3B", (1_300_000_000, M2, *A100_NIC)),
    ("Ψ = 7.5B (36 × 4096), 2M tokens, H100 over one NIC each", (PSI_7_5B, M2, *H100_NIC)),
    ("Ψ = 7.5B, 32 × 2048 tokens, H100 over NVLink", (PSI_7_5B, 32 * 2048, *H100_NVLINK)),
    ("Ψ = 2^33, T = 2^17 tokens, F = 2^50 FLOP/s, β = 2^35 B/s", (2**33, 2**17, 2.0**50, 2.0**35)),
    ("Ψ = 1.3B, one 2048-token sequence per step, A100 over its NIC", (1_300_000_000, 2048, *A100_NIC)),
]
TP_CASES = [
    ("h = 12288 (GPT-3), one 2048-token sequence, A100 over NVLink", (12288, 2048, *A100_NVLINK)),
    ("the same with 8 sequences per micro-batch", (12288, 8 * 2048, *A100_NVLINK)),
    ("h = 4096 (7.5B), one sequence, H100 over NVLink", (4096, 2048, *H100_NVLINK)),
    ("h = 4096, one sequence, A100 over NVLink", (4096, 2048, *A100_NVLINK)),
    ("h = 2^14, 2^11 tokens, F = 2^50 FLOP/s, β = 2^36 B/s", (2**14, 2**11, *EXACT)),
    ("h = 4096, one sequence, H100 over one NIC each", (4096, 2048, *H100_NIC)),
]
BATCH_CASES = [
    ("N = 8 H100s over one NIC each, 2048-token sequences", (8, 2048, *H100_NIC)),
    ("N = 1024 H100s, whole nodes over their 8 NICs, 2048-token sequences", (1024, 2048, *H100_NODES)),
    ("N = 64 A100s over their NICs, 2048-token sequences", (64, 2048, *A100_NIC)),
    ("N = 4, s = 2^12, F = 2^50 FLOP/s, β = 2^36 B/s", (4, 2**12, *EXACT)),
    ("N = 1 H100, 2048-token sequences", (1, 2048, *H100_NIC)),
    ("N = 8 H100s over NVLink, 2048-token sequences", (8, 2048, *H100_NVLINK)),
]


# --- the closed forms, exactly: Fraction(x) is a float's exact binary value ---------------------------------

def dp_slack(params, tokens, flops, bandwidth) -> Fraction:
    """The bound on N − 1 for DDP and ZeRO-3: (N−1)·F ≤ T·β."""
    return Fraction(tokens) * Fraction(bandwidth) / Fraction(flops)


def tp_slack(hidden, tokens, flops, bandwidth) -> Fraction:
    """The bound on t − 1 for Megatron TP: 2 · 2(t−1)/t · 2bsh / β ≤ 24bsh²/(tF) ⇔ (t−1)·F ≤ 3hβ."""
    return 3 * Fraction(hidden) * Fraction(bandwidth) / Fraction(flops)


def largest_degree(slack: Fraction) -> int:
    return 1 + math.floor(slack)


def batch_need(degree, seq, flops, bandwidth) -> Fraction:
    """Sequences (over all N devices) from which DDP's all-reduce fits in backward: (N−1)·F/(s·β)."""
    return (degree - 1) * Fraction(flops) / (Fraction(seq) * Fraction(bandwidth))


def min_batch(degree, seq, flops, bandwidth) -> int:
    """The smallest multiple B of N from `batch_need` on, and at least one sequence per device."""
    return degree * max(1, math.ceil(batch_need(degree, seq, flops, bandwidth) / degree))


# --- what a learner's answer costs, for the message -------------------------------------------------------------

def _t(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms" if seconds < 1 else f"{seconds:.4g} s"


def dp_times(n, params, tokens, flops, bandwidth) -> str:
    reduce = 2 * (n - 1) / n * 2 * params / bandwidth
    return f"at N = {n} the all-reduce takes {_t(reduce)}, backward {_t(4 * params * tokens / n / flops)}"


def fsdp_times(n, params, tokens, flops, bandwidth) -> str:
    gather = (n - 1) / n * 2 * params / bandwidth
    return f"at N = {n} the forward's all-gather takes {_t(gather)}, forward {_t(2 * params * tokens / n / flops)}"


def tp_times(t, hidden, tokens, flops, bandwidth) -> str:
    reduces = 2 * (2 * (t - 1) / t * 2 * tokens * hidden) / bandwidth
    return (f"at t = {t} a layer's 2 forward all-reduces take {_t(reduces)}, its forward "
            f"{_t(24 * tokens * hidden**2 / t / flops)}")


# --- hints: what a wrong answer reveals -------------------------------------------------------------------------

BYTES_2X = ("twice the bound: the collectives carry bf16, 2 bytes per element (2Ψ bytes for Ψ gradients or "
            "weights, not Ψ), and β is one way, not both directions added")
BYTES_HALF = "half the bound: 4-byte (fp32) elements? The collectives here carry bf16, 2 bytes each"
TIES = ("here communication takes exactly as long as compute at the expected answer, which still counts; your "
        "comparison lost it ({}, or float rounding): compare exact quantities, e.g. {}")
DP_HINTS = [(1.5, "1.5× the bound: you compared with the whole step's 6Ψ FLOPs per token, but gradients exist "
                  "only in backward: the all-reduce can hide behind backward's 4Ψ per token, not the forward"),
            (2, BYTES_2X), (0.5, BYTES_HALF)]
FSDP_HINTS = [(2 / 3, "2/3 of the bound: all of ZeRO-3's 1.5× bytes against backward? The forward's all-gather "
                      "hides behind the forward (2Ψ FLOPs per token): compare each pass's collectives with that "
                      "pass's compute"),
              (1.5, "1.5× the bound: two collectives against the whole step? ZeRO-3 runs three: the forward's "
                    "all-gather, then backward's all-gather again and the reduce-scatter; each pass hides its own"),
              (2, BYTES_2X), (0.5, BYTES_HALF)]
TP_HINTS = [(1.5, "1.5× the bound: you compared the whole step (4 all-reduces, 72bsh²/t FLOPs); the forward's "
                  "2 all-reduces sit between its matmuls and can overlap only the forward (24bsh²/t)"),
            (2, "twice the bound: 2 all-reduces per layer in forward (after attention and after the MLP), each "
                "of b·s·h bf16 activations (2 bytes each); the forward (24bsh²), not the backward, binds"),
            (2 / 3, "2/3 of the bound: a layer's forward is 24bsh² FLOPs: attention's four h×h matmuls (8bsh²) "
                    "and the MLP's two h×4h (16bsh²)"),
            (0.5, BYTES_HALF)]


def _scaled_hint(got: int, slack: Fraction, hints) -> str | None:
    """The hint whose factor k puts k·slack within one of got − 1 (and far enough from the right answer)."""
    for k, text in hints:
        if abs((got - 1) - k * slack) <= 1 and abs(k - 1) * slack >= 2:
            return text
    return None


def _whole(got) -> bool:
    return isinstance(got, numbers.Integral) and not isinstance(got, bool)  # int, numpy ints; not 85.0, not True


def _degree_check(fn, cases, slack_of, times, hints, *, what: str, cancels: str, exact: str) -> list[str]:
    """The first case `fn` gets wrong, with what its answer reveals. `cancels` names the argument that must not
    matter (Ψ, the first; or the tokens, the second); `exact` is a comparison that survives rounding."""
    answers: dict[tuple, int] = {}
    for label, args in cases:
        slack = slack_of(*args)
        want, got = largest_degree(slack), fn(*args)
        if not _whole(got):
            return [f"{label}: expected the whole number {want}, got {got!r}. Hint: a degree is a count of "
                    f"devices: return an int, the largest N whose {what} (round the real-valued bound down)"]
        got = int(got)
        key = args[1:] if cancels == "Ψ" else (args[0], *args[2:])
        if got == want:
            answers[key] = got
            continue
        said = f"{label}: expected {want}, got {got}"
        if got < 1:
            return [f"{said}. Hint: one device sends nothing, so 1 always works: the answer is at least 1"]
        if key in answers:
            hint = (f"your answer changed when only {cancels} changed ({answers[key]} → {got}): it multiplies "
                    "both the bytes and the FLOPs, so it cancels")
        elif got == want - 1 and slack.denominator == 1:
            hint = TIES.format("< instead of ≤, ceil instead of 1 + floor", exact)
        elif got == want - 1:
            hint = ("one below: forgot the ring's (N−1)/N? A ring collective of S bytes makes each rank send "
                    "(N−1)/N·S (an all-reduce twice that), so one device sends nothing")
        elif got > want:
            hint = _scaled_hint(got, slack, hints) or (f"{got} is communication-bound: return the largest "
                                                        f"degree whose {what} (round the bound down)")
        else:
            hint = _scaled_hint(got, slack, hints) or f"{want} still hides its communication: {times(want, *args)}"
        return [f"{said}: {times(got, *args)}. Hint: {hint}"]
    return []


@register("max_dp_degree", summary="the largest data-parallel degree whose gradient all-reduce (ring, bf16) hides "
          "behind backward, 1 + ⌊Tβ/F⌋, on 6 cases incl. 7.5B on H100s and a bound hit exactly")
def max_dp_degree_check(max_dp_degree, *, seed: int) -> list[str]:
    return _degree_check(max_dp_degree, DP_CASES, dp_slack, dp_times, DP_HINTS, cancels="Ψ",
                         what="all-reduce takes no longer than backward", exact="(N−1)·F ≤ T·β, or solve for N")


@register("max_fsdp_degree", summary="the largest ZeRO-3 degree whose all-gathers and reduce-scatters hide behind "
          "forward and backward: 1.5× DDP's bytes, the same bound, on 6 cases incl. 7.5B on H100s")
def max_fsdp_degree_check(max_fsdp_degree, *, seed: int) -> list[str]:
    return _degree_check(max_fsdp_degree, FSDP_CASES, dp_slack, fsdp_times, FSDP_HINTS, cancels="Ψ",
                         what="collectives take no longer than the pass they overlap",
                         exact="(N−1)·F ≤ T·β, or solve for N")


@register("max_tp_degree", summary="the largest Megatron tensor-parallel degree whose forward all-reduces take no "
          "longer than the forward's 24bsh²/t FLOPs, 1 + ⌊3hβ/F⌋, on 6 cases from 7.5B to GPT-3")
def max_tp_degree_check(max_tp_degree, *, seed: int) -> list[str]:
    return _degree_check(max_tp_degree, TP_CASES, tp_slack, tp_times, TP_HINTS, cancels="the tokens",
                         what="forward all-reduces take no longer than the forward",
                         exact="(t−1)·F ≤ 3·h·β, or solve for t")


@register("min_dp_batch", summary="the smallest global batch (whole sequences on every device) that keeps N "
          "data-parallel devices compute-bound, on 6 cases from 1 to 1024 H100s")
def min_dp_batch_check(min_dp_batch, *, seed: int) -> list[str]:
    for label, args in BATCH_CASES:
        n, seq = args[0], args[1]
        want, got = min_batch(*args), min_dp_batch(*args)
        if not _whole(got):
            return [f"{label}: expected the whole number {want}, got {got!r}. Hint: a batch is a count of "
                    "sequences: return an int (round the real-valued bound up)"]
        got = int(got)
        if got == want:
            continue
        need = batch_need(*args)
        said = (f"{label}: expected {want} sequence{'s' * (want != 1)}, got {got} ({got / n:.4g} per device); "
                f"the all-reduce fits in backward from (N−1)·F/(s·β) = {float(need):.4g} sequences on")
        if got < 1:
            hint = "every device needs at least one sequence"
        elif got >= seq and abs(got - max(want, need) * seq) <= n * seq:
            hint = "count sequences, not tokens"
        elif got % n:
            hint = f"each of the {n} devices gets B/N whole sequences: round up to a multiple of N = {n}"
        elif got < need and abs(got - 2 * need / 3) <= n:
            hint = ("too small: you compared with the whole step's 6Ψ FLOPs per token, but gradients exist only "
                    "in backward, so the all-reduce hides behind backward's 4Ψ per token alone")
        elif got < need:
            hint = "too small: at this batch the all-reduce outlasts backward; round up, not down"
        elif got == want + n and want == need:
            hint = TIES.format("> instead of ≥, 1 + floor instead of ceil", "B·s·β ≥ (N−1)·F, or solve for B")
        elif n > 1 and abs(got - n * need / (n - 1)) <= n:
            hint = "forgot the ring's (N−1)/N? Each rank sends 2(N−1)/N·2Ψ bytes for the all-reduce"
        elif abs(got - 2 * need) <= n:
            hint = BYTES_2X.replace("twice the bound", "twice the batch")
        else:
            hint = f"{want} sequences already hide the all-reduce: return the smallest such multiple of N"
        return [f"{said}. Hint: {hint}"]
    return []
