"""Exercise 13: how far data parallelism, ZeRO-3 and tensor parallelism scale before they wait on the network.

Graded in-process, on plain numbers: max_dp_degree, max_fsdp_degree, max_tp_degree, min_dp_batch. The resource
is time: in each pass, a collective's ring time (bytes sent / β, β one way per device, α ignored, bf16 = 2 B) may
not exceed the compute of the pass it overlaps (F FLOP/s; 2Ψ forward, 4Ψ backward per token; T/N a real number).
  DP (DDP)      all-reduce 2(N−1)/N·2Ψ B ≤ backward 4ΨT/N FLOPs  ⇒  (N−1)·F ≤ T·β,  N* = 1 + ⌊Tβ/F⌋
  FSDP (ZeRO-3) all-gather (N−1)/N·2Ψ ≤ forward 2ΨT/N; all-gather + reduce-scatter ≤ backward  ⇒  the same N*
  TP (Megatron) per layer in forward, 2 all-reduces of the b·s·h bf16 activations, 2(t−1)/t·2bsh B each,
                ≤ 24bsh²/t FLOPs (backward: same bytes, twice the FLOPs)  ⇒  (t−1)·F ≤ 3hβ,  t* = 1 + ⌊3hβ/F⌋
  DP batch      B sequences of s tokens, a multiple of N, B·s·β ≥ (N−1)·F  ⇒  B = N·max(1, ⌈(N−1)F/(Nsβ)⌉)
Ψ cancels for DP and FSDP, the tokens for TP. Austin et al. 2025, "How to Scale Your Model", §5; Rajbhandari et
al. 2020, §7.2 (ZeRO-3: 1.5× DDP's bytes); Shoeybi et al. 2019, §3; Narayanan et al. 2021, §5.1 (24bsh²).

Every run draws 7 cases per check from its seed (trials.py): the devices of `theory.hardware` at peak or at a
sustained share, their links from `theory.network.group_link` (NVLink, or a group with 1, 2, 4 or 8 members per
node, at the datasheet or at NCCL's shares), Ψ from 100M to 1T, 1 to 4,096 sequences of 1k to 8k tokens, the widths
of real models. Each run has a case at the bound exactly (in decimal units whose float arithmetic is exact), one
answering 1 (the batch: N), one whose bound's fraction is above ½, and for DP, FSDP and TP a pair that differs only
in the argument that cancels. All answers are taken before any is judged: a hint names a cause only when every case
agrees with it (a factor seen in at least two cases, a rounding seen where it shows), and names all the mistakes
that give those same numbers.

The closed forms and the cases are communication_bounds_reference.py's; this module prices an answer, reads the
mistakes all the answers reveal and registers the four checks.
"""
from __future__ import annotations

import math
import numbers
from fractions import Fraction

from partrain_edu.grading.checks.communication_bounds_reference import (
    batch_cases,
    batch_need,
    dp_cases,
    dp_slack,
    largest_degree,
    min_batch,
    tp_cases,
    tp_slack,
)
from partrain_edu.grading.registry import register

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


def batch_times(b, n, seq, flops, bandwidth) -> str:   # per parameter: Ψ cancels, so a 1B model shows the scale
    reduce = 2 * (n - 1) / n * 2e9 / bandwidth
    return f"at B = {b} a 1B model's all-reduce takes {_t(reduce)}, its backward {_t(4e9 * b * seq / n / flops)}"


# --- hints: what every answer together reveals ----------------------------------------------------------------

SAME = " — these give the same numbers: check each"
WHOLE_STEP = ("compared with the whole step's 6Ψ FLOPs per token? The gradients exist only in backward, so the "
              "all-reduce hides behind backward's 4Ψ per token alone (notebook 11's rule of thumb counts the whole "
              "step; this exercise prices each pass)")
HALF_BYTES = ("half the bytes against the same compute: Ψ bytes for Ψ bf16 values (they are 2Ψ), β counted in both "
              "directions (it is one way), or a ring collective priced at half its (N−1)/N share" + SAME)
DOUBLE_DP = ("twice the bytes, or half the compute: 4-byte fp32 gradients (they are bf16), the all-reduce counted "
             "twice (2(N−1)/N·S already holds its reduce-scatter and its all-gather), or the forward's 2Ψ per token "
             "instead of backward's 4Ψ" + SAME)
DEGREE_CAUSES = {  # factor k: the answers are 1 + ⌊k·bound⌋ (give or take one)
    "max_dp_degree": {Fraction(3, 2): WHOLE_STEP, Fraction(2): HALF_BYTES, Fraction(1, 2): DOUBLE_DP},
    "max_fsdp_degree": {
        Fraction(2, 3): ("all three collectives against backward alone? The forward's all-gather hides behind the "
                         "forward (2Ψ FLOPs per token): compare each pass's collectives with that pass's compute"),
        Fraction(3, 2): ("two collectives against the whole step's 6Ψ per token (or DDP's all-reduce)? ZeRO-3 runs "
                         "three: the forward's all-gather, then backward's all-gather again and the reduce-scatter; "
                         "each pass hides its own"),
        Fraction(2): HALF_BYTES,
        Fraction(1, 2): ("twice the bytes: 4-byte fp32 (they are bf16), or an all-gather or reduce-scatter priced "
                         "like an all-reduce (they send (N−1)/N·S, an all-reduce twice that)" + SAME)},
    "max_tp_degree": {
        Fraction(3, 2): ("the whole step: 4 all-reduces against 72bsh²/t FLOPs? The forward's 2 all-reduces sit "
                         "between its matmuls and can overlap only the forward (24bsh²/t)"),
        Fraction(2): ("half the bytes against the forward, or twice its compute: one all-reduce per layer (there are "
                      "2, after attention and after the MLP), 1-byte elements (bf16 is 2), β in both directions, or "
                      "the backward's 48bsh²/t instead of the forward's 24bsh²/t" + SAME),
        Fraction(2, 3): ("a forward of 16bsh²/t FLOPs, the MLP's two h×4h matmuls alone? Attention's four h×h "
                         "projections add 8bsh²: 24bsh² in all"),
        Fraction(1, 2): ("twice the bytes against the forward: the backward's 2 all-reduces counted too (4 against "
                         "the forward's 24bsh²/t), or 4-byte fp32 activations (they are bf16)" + SAME)},
}
BATCH_CAUSES = {Fraction(2, 3): WHOLE_STEP, Fraction(1, 2): HALF_BYTES, Fraction(2): DOUBLE_DP}  # B ≈ factor × need
TIES = ("only where communication takes exactly as long as compute is your answer off, and that still counts: your "
        "comparison lost the tie ({}, or float rounding): compare exact quantities, e.g. {}")


def _whole(got) -> bool:
    return isinstance(got, numbers.Integral) and not isinstance(got, bool)  # int, numpy ints; not 85.0, not True


def _explained(answers: list, truths: list, rules: list) -> str | None:
    """The texts of the rules (text, predictions, slack, cases) whose predictions are within `slack` of every
    answer and stand clear of the right answers (by over 2·slack) in at least `cases` cases; None when none is.
    Rules that fit the same answers are all named: the numbers cannot tell them apart."""
    fits = [text for text, predicted, slack, cases in rules
            if all(abs(a - p) <= slack for a, p in zip(answers, predicted, strict=True))
            and sum(abs(p - t) > 2 * slack for p, t in zip(predicted, truths, strict=True)) >= cases]
    return None if not fits else fits[0] if len(fits) == 1 else \
        "your answers fit more than one mistake — " + "; or ".join(fits)


RING = ("forgot the ring's (N−1)/N? A ring collective of S bytes makes each rank send (N−1)/N·S (an all-reduce "
        "twice that), so one device sends nothing")
NEAREST = "one above wherever the bound's fraction is over ½: round the bound down (floor), not to the nearest"


def _degree_check(name, fn, cases, slack_of, times, *, what: str, cancels: str, exact: str) -> list[str]:
    """The first case `fn` gets wrong, with what all its answers together reveal."""
    answers = []
    for label, args in cases:   # every answer first: the evidence for a hint is all of them
        got = fn(*args)
        want = largest_degree(slack_of(*args))
        if not _whole(got):
            return [f"{name}{args} — {label}: expected the whole number {want}, got {got!r:.40}. Hint: a degree is "
                    f"a count of devices: return an int, the largest N whose {what} (round the bound down)"]
        answers.append(int(got))
    slacks = [slack_of(*args) for _, args in cases]
    wrong = [i for i, (s, got) in enumerate(zip(slacks, answers, strict=True)) if got != largest_degree(s)]
    if not wrong:
        return []
    i = wrong[0]   # the first case wrong: its numbers are told
    label, args = cases[i]
    got = answers[i]
    slack = slacks[i]
    said = f"{name}{args} — {label}: expected {largest_degree(slack)}, got {got}"
    if got < 1:
        return [f"{said}. Hint: one device sends nothing, so 1 always works: the answer is at least 1"]
    truths = [largest_degree(s) for s in slacks]
    rules = [("one below wherever the bound is not whole: " + RING, [max(1, math.floor(s)) for s in slacks], 0, 1),
             (TIES.format("< instead of ≤, ceil instead of 1 + floor", exact), [max(1, math.ceil(s)) for s in slacks],
              0, 1),
             (NEAREST, [1 + round(s) for s in slacks], 0, 1)]
    rules += [(text, [1 + k * s for s in slacks], 1, 2) for k, text in DEGREE_CAUSES[name].items()]
    if answers[0] != answers[1]:   # the pair that differs only in the argument that cancels
        hint = (f"your answer changed when only {cancels} changed ({answers[0]} → {answers[1]}): it multiplies both "
                "the bytes and the FLOPs, so it cancels")
    else:
        want = largest_degree(slack)
        hint = (_explained(answers, truths, rules)
                or (f"{got} is communication-bound: return the largest degree whose {what}" if got > want
                    else f"{want} still hides its communication: {times(want, *args)}"))
    return [f"{said}: {times(got, *args)}. Hint: {hint}"]


@register("max_dp_degree", summary="the largest data-parallel degree whose gradient all-reduce (ring, bf16) hides "
          "behind backward, 1 + ⌊Tβ/F⌋, on 7 cases drawn per run (devices, links, Ψ, tokens), one at the bound exactly")
def max_dp_degree_check(max_dp_degree, *, seed: int) -> list[str]:
    return _degree_check("max_dp_degree", max_dp_degree, dp_cases(seed, "max_dp_degree"), dp_slack, dp_times,
                         cancels="Ψ", what="all-reduce takes no longer than backward",
                         exact="(N−1)·F ≤ T·β, or solve for N")


@register("max_fsdp_degree", summary="the largest ZeRO-3 degree whose all-gathers and reduce-scatters hide behind "
          "forward and backward: 1.5× DDP's bytes, the same bound, on 7 cases drawn per run, one at the bound exactly")
def max_fsdp_degree_check(max_fsdp_degree, *, seed: int) -> list[str]:
    return _degree_check("max_fsdp_degree", max_fsdp_degree, dp_cases(seed, "max_fsdp_degree"), dp_slack,
                         fsdp_times, cancels="Ψ", what="collectives take no longer than the pass they overlap",
                         exact="(N−1)·F ≤ T·β, or solve for N")


@register("max_tp_degree", summary="the largest Megatron tensor-parallel degree whose forward all-reduces take no "
          "longer than the forward's 24bsh²/t FLOPs, 1 + ⌊3hβ/F⌋, on 7 cases drawn per run (widths, devices, links)")
def max_tp_degree_check(max_tp_degree, *, seed: int) -> list[str]:
    return _degree_check("max_tp_degree", max_tp_degree, tp_cases(seed), tp_slack, tp_times, cancels="the tokens",
                         what="forward all-reduces take no longer than the forward",
                         exact="(t−1)·F ≤ 3·h·β, or solve for t")


def _batch_hint(cases, answers, i) -> str:
    """What the answers to the batch's cases reveal, from the first wrong one, case `i`."""
    (n, seq, flops, beta), got = cases[i][1], answers[i]
    need, want = batch_need(n, seq, flops, beta), min_batch(n, seq, flops, beta)
    if got < n:
        return f"each of the {n} devices needs at least one whole sequence: B ≥ N"
    if got >= seq and (abs(got - want * seq) <= n * seq or abs(got - need * seq) <= n * seq):
        return "count sequences, not tokens"
    if got % n:
        return f"each of the {n} devices gets B/N whole sequences: round up to a multiple of N = {n}"
    every = [args for _, args in cases]

    def per_device(rounding, factor=Fraction(1)):
        return [a[0] * max(1, rounding(factor * batch_need(*a) / a[0])) for a in every]
    rules = [(RING, [a[0] * max(1, math.ceil(Fraction(a[2]) / (a[1] * Fraction(a[3])))) for a in every], 0, 1),
             (TIES.format("> instead of ≥, 1 + floor instead of ceil", "B·s·β ≥ (N−1)·F, or solve for B"),
              per_device(lambda x: math.floor(x) + 1), 0, 1),
             ("too small wherever the bound is not whole: at such a batch the all-reduce outlasts backward; round up",
              per_device(math.floor), 0, 1)]
    rules += [(text, per_device(math.ceil, k), 0, 2) for k, text in BATCH_CAUSES.items()]
    found = _explained(answers, [min_batch(*a) for a in every], rules)
    if found:
        return found
    if got < need:
        return "too small: at this batch the all-reduce outlasts backward"
    return f"{want} sequences already hide the all-reduce: return the smallest such multiple of N"


@register("min_dp_batch", summary="the smallest global batch (whole sequences on every device) that keeps N "
          "data-parallel devices compute-bound, on 7 cases drawn per run from 1 to 4,096 devices")
def min_dp_batch_check(min_dp_batch, *, seed: int) -> list[str]:
    cases, answers = batch_cases(seed), []
    for label, args in cases:
        got, want = min_dp_batch(*args), min_batch(*args)
        if not _whole(got):
            return [f"min_dp_batch{args} — {label}: expected the whole number {want}, got {got!r:.40}. Hint: a "
                    "batch is a count of sequences: return an int (round the real-valued bound up)"]
        answers.append(int(got))
    for i, ((label, args), got) in enumerate(zip(cases, answers, strict=True)):
        want = min_batch(*args)
        if got != want:
            n = args[0]
            return [f"min_dp_batch{args} — {label}: expected {want} sequence{'s' * (want != 1)}, got {got} "
                    f"({got / n:.4g} per device); the all-reduce fits in backward from (N−1)·F/(s·β) = "
                    f"{float(batch_need(*args)):.4g} sequences on; {batch_times(got, *args)}. Hint: "
                    f"{_batch_hint(cases, answers, i)}"]
    return []
