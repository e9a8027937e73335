"""Exercise 03, model-state memory (模型状态) under ZeRO, in process: `model_state_bytes(params, dp, zero)` —
bytes per device of fp16 weights 2Ψ, fp16 gradients 2Ψ and fp32 Adam states 12Ψ, each divided by N_d from
its stage on (Rajbhandari et al. 2020, §5; a shard is ⌈Ψ/N_d⌉ parameters) — and
`smallest_zero_stage(params, dp, device_bytes)`, the lowest stage whose model states fit (None when even ZeRO-3
does not).

Every run draws its models from its seed (trials.py): Ψ from 10M to 2T parameters, N_d from the device counts of
real clusters (1 to 4,096, some not powers of two), so no two runs grade the same numbers.
- `model_state_bytes`: two models at each stage, one of them with N_d not dividing Ψ (the shard's padding
  counts), and one stage over N_d = 1 (nothing to shard); graded stage 0 first, then the term each stage shards.
  A wrong answer is taken apart with three more calls on models N_d divides: the bytes per parameter it keeps on
  one device, and how many of them it divides by N_d at that stage — the earliest of those that is wrong is named.
- `zero_stage`: a budget exactly at each stage's need (it fits: ≤), one a byte short of a stage's need, real
  GPU sizes, one where even ZeRO-3 does not fit and one model on a single device: every answer 0, 1, 2, 3 and
  None in every run.
The reference is theory.memory, imported in the grader only: a sandbox has none to import.
"""
from __future__ import annotations

import numbers
from fractions import Fraction

from partrain_edu.grading.registry import register
from partrain_edu.grading.trials import stream

# device counts of real jobs: powers of two, and the 3·2^k of 24- and 96-GPU pods
DEVICES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
GPU_GB = (16, 24, 32, 40, 48, 80, 94, 96, 141, 192)  # device memory of V100 … B200, in GB or GiB
WHOLE = {0: 16, 1: 4, 2: 2, 3: 0}  # bytes per parameter kept whole on every device at each stage (the rest: sharded)
SHARDED_TERMS = {0: "nothing", 1: "the optimizer states (12)", 2: "the optimizer states and gradients (12 + 2)",
                 3: "all three: optimizer states, gradients and weights (12 + 2 + 2)"}
KEPT_TERMS = {0: "all 16", 1: "the weights and gradients (2 + 2)", 2: "the weights (2)", 3: "nothing"}
SIXTEEN = ("mixed precision with Adam keeps 16: fp16 weights 2 + fp16 gradients 2 + fp32 Adam states (master "
           "weights, momentum, variance) 4 + 4 + 4")


def reference_total(params: int, dp: int, zero: int) -> int:
    from partrain_edu.theory.memory import model_state_bytes  # the reference: in the grader only

    return sum(model_state_bytes(params, dp=dp, zero=zero))


def _model(rng, dp_min: int = 1, padded: bool = False) -> tuple[int, int]:
    """(Ψ, N_d): Ψ log-uniform from 10M to 2T; with `padded`, N_d does not divide Ψ."""
    while True:
        params = int(10 ** rng.uniform(7, 12.3))
        dp = rng.choice([d for d in DEVICES if d >= dp_min])
        if not padded or params % dp:
            return params, dp


def state_cases(seed: int) -> list[tuple[int, int, int]]:
    """The run's (Ψ, N_d, stage), stage 0 first: two models per stage (from stage 1 on, one with padding), and
    one stage over a single device."""
    rng = stream(seed, "model_state_bytes")
    cases = [(*_model(rng), 0), (*_model(rng), 0)]
    for zero in (1, 2, 3):
        cases += [(*_model(rng, dp_min=3, padded=True), zero), (*_model(rng), zero)]
    cases.append((_model(rng)[0], 1, rng.randint(1, 3)))
    return sorted(cases, key=lambda case: case[2])


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def per_parameter(fn, zero: int, rng) -> tuple[Fraction, Fraction] | None:
    """(bytes per parameter your answer keeps whole, bytes per parameter it divides by N_d) at stage `zero`,
    measured on models whose Ψ N_d divides (no padding); None when its answers are not of that form."""
    shard = rng.randrange(10**6, 10**8)
    d1 = rng.choice((8, 16, 64))
    d2 = rng.choice((4, 32, 128))
    one = fn(shard * d1, 1, zero)
    spread = fn(shard * d1, d1, zero)
    check = fn(shard * d2, d2, zero)
    if not all(map(_whole, (one, spread, check))):
        return None
    total = Fraction(one, shard * d1)
    kept = (spread - total * shard) / ((d1 - 1) * shard)
    return (kept, total - kept) if kept * shard * d2 + (total - kept) * shard == check else None


def _n(x: Fraction) -> str:
    return f"{float(x):g}"


def _state_hint(fn, params: int, dp: int, zero: int, rng) -> str:
    """What a wrong total reveals, from the earliest wrong quantity: the bytes per parameter, then which of them
    the stage shards, then the padding."""
    fit = per_parameter(fn, zero, rng)
    if fit is None:
        return ("fp16 weights 2Ψ + fp16 gradients 2Ψ + fp32 Adam states 12Ψ; stage 1 shards the 12Ψ, stage 2 also "
                "the gradients, stage 3 also the weights; a shard is ⌈Ψ/N_d⌉ parameters. On models N_d divides your "
                "answers are not a·Ψ + b·Ψ/N_d for any a, b: does an integer division round too early (12 // N_d)?")
    kept, sharded = fit
    if kept + sharded != 16:
        return (f"on one device (N_d = 1, nothing to shard) your answer keeps {_n(kept + sharded)} bytes per "
                f"parameter; {SIXTEEN}")
    if kept != WHOLE[zero]:
        return (f"at ZeRO-{zero} your answer keeps {_n(kept)} bytes per parameter whole on every device and divides "
                f"{_n(sharded)} by N_d; ZeRO-{zero} shards {SHARDED_TERMS[zero]} and keeps {KEPT_TERMS[zero]} "
                "whole (stage 1 shards the optimizer states, stage 2 also the gradients, stage 3 also the weights)")
    if params % dp:
        return (f"right where N_d divides Ψ, wrong here where it does not (Ψ mod N_d = {params % dp}): a shard holds "
                "⌈Ψ/N_d⌉ parameters, the last one padded (in integers: -(-Ψ // N_d))")
    return ("your answers are right on the models probed (N_d dividing Ψ) but not on this one: compare your "
            "formula, term by term, with 2Ψ + 2Ψ + 12Ψ, each divided by N_d (⌈Ψ/N_d⌉) from its stage on")


@register("model_state_bytes", summary="bytes per device match the ZeRO paper (2Ψ + 2Ψ + 12Ψ, each term "
          "divided by N_d from its stage on, a shard ⌈Ψ/N_d⌉) on 9 models drawn per run, every stage among them")
def verify_state_bytes(model_state_bytes, *, seed: int) -> list[str]:
    rng = stream(seed, "model_state_bytes probes")
    for params, dp, zero in state_cases(seed):
        want, got = reference_total(params, dp, zero), model_state_bytes(params, dp, zero)
        call = f"model_state_bytes({params}, {dp}, {zero}) (Ψ = {params:,} on N_d = {dp}, ZeRO-{zero})"
        if not _whole(got):
            why = " a shard is ⌈Ψ/N_d⌉ whole parameters: -(-Ψ // N_d) in integers, not Ψ / N_d" if zero else ""
            return [f"{call}: expected an int, a number of bytes, got {got!r:.60}.{' Hint:' * bool(why)}{why}"]
        if got != want:
            ratio = (f"{abs(got - want):,} bytes {'over' if got > want else 'short'}" if abs(got - want) * 1000 < want
                     else f"{got / want:.3g}× the expected")
            return [f"{call}: expected {want:,} bytes, got {got:,} ({ratio}). Hint: "
                    f"{_state_hint(model_state_bytes, params, dp, zero, rng)}"]
    return []


# --- zero_stage ------------------------------------------------------------------------------------------------

def stage_cases(seed: int) -> list[tuple[int, int, int]]:
    """The run's (Ψ, N_d, device bytes), shuffled: each stage's exact need, a byte short of one, real GPUs, a
    budget under ZeRO-3's need, and a single device."""
    rng = stream(seed, "zero_stage")
    cases = []
    for zero in range(4):                                       # exactly at the need: that stage fits
        params, dp = _model(rng, dp_min=2)
        cases.append((params, dp, reference_total(params, dp, zero)))
    params, dp = _model(rng, dp_min=2)                          # a byte short: the next stage, or None
    cases.append((params, dp, reference_total(params, dp, rng.randrange(4)) - 1))
    for _ in range(2):                                          # a real GPU
        params, dp = _model(rng, dp_min=2)
        cases.append((params, dp, rng.choice(GPU_GB) * rng.choice((10**9, 2**30))))
    params, dp = _model(rng, dp_min=2)                          # even ZeRO-3 does not fit
    cases.append((params, dp, rng.randrange(reference_total(params, dp, 3) // 2, reference_total(params, dp, 3))))
    params = _model(rng)[0]                                     # one device: every stage the same 16Ψ
    cases.append((params, 1, 16 * params + rng.choice((-1, 0, 1)) * rng.randrange(1, params)))
    rng.shuffle(cases)
    return cases


def reference_stage(params: int, dp: int, device_bytes: int) -> int | None:
    return next((z for z in range(4) if reference_total(params, dp, z) <= device_bytes), None)


def _stage_hint(cases: list, answers: list, i: int) -> str:
    """What the answers reveal, from the first wrong one (case `i`): a cause only where every answer agrees."""
    (params, dp, device), got = cases[i], answers[i]
    want, need = reference_stage(params, dp, device), {z: reference_total(params, dp, z) for z in range(4)}

    def strict(p, d, b):   # what "<" instead of "≤" answers
        return next((z for z in range(4) if reference_total(p, d, z) < b), None)

    if want is None:
        return ("even ZeRO-3's model states exceed the device's bytes here: return None when no stage fits (more "
                "devices, or offloading, are the way out)")
    if need[want] == device and all(got == strict(*case) for case, got in zip(cases, answers, strict=True)):
        said = "no stage" if got is None else f"ZeRO-{got}"
        return (f"{said}, where ZeRO-{want}'s model states take exactly the device's bytes, and that fits: "
                "compare with ≤, not <")
    if got is not None and need[got] <= device:
        return (f"ZeRO-{got} fits, but so does a lower stage: return the LOWEST stage that fits (fewest collectives; "
                "only stage 3 moves 1.5× the bytes)")
    short = f", and ZeRO-{got}'s do not" if got is not None else ""
    return (f"ZeRO-{want}'s model states fit in the device's bytes{short} (if your answer calls your "
            "model_state_bytes, make its check pass first)")


@register("zero_stage", summary="the lowest ZeRO stage whose model states fit (None when even ZeRO-3 does not), "
          "on 9 models and budgets drawn per run: each stage's exact need, real GPUs, none fitting")
def verify_zero_stage(smallest_zero_stage, *, seed: int) -> list[str]:
    cases, answers = stage_cases(seed), []
    for params, dp, device in cases:   # every answer first: a hint's cause must fit them all
        got = smallest_zero_stage(params, dp, device)
        if got is not None and not (_whole(got) and 0 <= got <= 3):
            return [f"{_stage_call(params, dp, device)}: expected a stage 0, 1, 2 or 3, or None, got {got!r:.60}"]
        answers.append(got)
    for i, ((params, dp, device), got) in enumerate(zip(cases, answers, strict=True)):
        want = reference_stage(params, dp, device)
        if got != want:
            return [f"{_stage_call(params, dp, device)}: expected {want!r}, got {got!r}. Hint: "
                    f"{_stage_hint(cases, answers, i)}"]
    return []


def _stage_call(params: int, dp: int, device: int) -> str:
    return f"smallest_zero_stage({params}, {dp}, {device}) (Ψ = {params:,} on N_d = {dp} GPUs of {device:,} bytes)"
