"""Exercise 03, model-state memory (模型状态) under ZeRO, in process: `model_state_bytes(params, dp, zero)` —
bytes per device of fp16 weights 2Ψ, fp16 gradients 2Ψ and fp32 Adam states 12Ψ, each divided by N_d from
its stage on (Rajbhandari et al. 2020) — and `smallest_zero_stage(params, dp, device_bytes)`, the
lowest stage whose model states fit (None when even ZeRO-3 does not).

Graded against partrain_edu.theory.memory on 7 cases each, Ψ = 7.5B on 64 GPUs among them. The reference is
imported in the grader only: a sandbox has none to import.
"""
from __future__ import annotations

from partrain_edu.grading.registry import register

MEMORY_CASES = [(7_500_000_000, 1, 0), (7_500_000_000, 64, 1), (7_500_000_000, 64, 2), (7_500_000_000, 64, 3),
                (1_000_000, 8, 1), (1_000_001, 8, 3), (350_000_000, 4, 2)]


def reference_total(params: int, dp: int, zero: int) -> int:
    from partrain_edu.theory.memory import model_state_bytes   # the reference: in the grader only

    return sum(model_state_bytes(params, dp=dp, zero=zero))


@register("model_state_bytes", summary="bytes per device match the ZeRO paper (2Ψ + 2Ψ + 12Ψ, each term "
          "divided by N_d from its stage on) for 7 models, including Ψ = 7.5B on 64 GPUs")
def verify_state_bytes(model_state_bytes, *, seed: int) -> list[str]:
    for params, dp, zero in MEMORY_CASES:
        want, got = reference_total(params, dp, zero), model_state_bytes(params, dp, zero)
        if got != want:
            hint = ("fp16 weights 2Ψ + fp16 gradients 2Ψ + fp32 Adam states (master weights, momentum, variance) "
                    "12Ψ; stage 1 shards the 12Ψ, stage 2 also the gradients, stage 3 also the weights; a "
                    "shard is ⌈Ψ/N_d⌉ parameters")
            ratio = f" ({got / want:.3g}× the expected)" if isinstance(got, (int, float)) and want else ""
            return [f"Ψ={params:,}, N_d={dp}, ZeRO-{zero}: expected {want:,} bytes, got {got!r}{ratio}. "
                    f"Hint: {hint}"]
    return []


ZERO_CASES = [(7_500_000_000, 64, 80 * 10**9), (7_500_000_000, 64, 16 * 10**9), (7_500_000_000, 8, 16 * 10**9),
              (7_500_000_000, 8, 24 * 10**9), (7_500_000_000, 64, 2 * 10**9), (1_000_000, 1, 10**6),
              (175_000_000_000, 1024, 80 * 10**9)]


def reference_stage(params: int, dp: int, device_bytes: int) -> int | None:
    return next((z for z in range(4) if reference_total(params, dp, z) <= device_bytes), None)


@register("zero_stage", summary="the lowest ZeRO stage whose model states fit (None when even ZeRO-3 does not) "
          "for 7 models and GPU sizes")
def verify_zero_stage(smallest_zero_stage, *, seed: int) -> list[str]:
    for params, dp, device in ZERO_CASES:
        want, got = reference_stage(params, dp, device), smallest_zero_stage(params, dp, device)
        if got != want:
            need = {z: reference_total(params, dp, z) for z in range(4)}
            return [f"Ψ={params:,} on N_d={dp} GPUs of {device:,} bytes: expected {want!r}, got {got!r}. Model "
                    f"states per GPU by stage: {need}. Hint: return the LOWEST stage that fits (fewest "
                    "collectives; only stage 3 moves 1.5× the bytes), and None when none does"]
    return []
