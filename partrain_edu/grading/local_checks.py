"""In-process checks (pure Python, instant): model-state memory and the ZeRO stage that fits, and a 1F1B
schedule generator. (Exercise 7's placement checks live in `checks/placement_3d.py`.)

Each returns a list of problems (empty = pass). References come from `partrain_edu.theory` (memory, schedules).
"""
from __future__ import annotations

from partrain_edu.grading.core import register
from partrain_edu.theory.schedules import Action, Schedule, simulate   # the sandbox's view has these three

MEMORY_CASES = [(7_500_000_000, 1, 0), (7_500_000_000, 64, 1), (7_500_000_000, 64, 2), (7_500_000_000, 64, 3),
                (1_000_000, 8, 1), (1_000_001, 8, 3), (350_000_000, 4, 2)]


def reference_total(params: int, dp: int, zero: int) -> int:
    from partrain_edu.theory.memory import model_state_bytes   # the reference: in the grader only

    return sum(model_state_bytes(params, dp=dp, zero=zero))


@register("model_state_bytes", summary="bytes per device match the ZeRO paper (2Ψ + 2Ψ + 12Ψ, each term "
          "divided by N_d from its stage on) for 7 models, including Ψ = 7.5B on 64 GPUs")
def model_state_check(model_state_bytes) -> list[str]:
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
def zero_stage_check(smallest_zero_stage) -> list[str]:
    for params, dp, device in ZERO_CASES:
        want, got = reference_stage(params, dp, device), smallest_zero_stage(params, dp, device)
        if got != want:
            need = {z: reference_total(params, dp, z) for z in range(4)}
            return [f"Ψ={params:,} on N_d={dp} GPUs of {device:,} bytes: expected {want!r}, got {got!r}. Model "
                    f"states per GPU by stage: {need}. Hint: return the LOWEST stage that fits (fewest "
                    "collectives; only stage 3 moves 1.5× the bytes), and None when none does"]
    return []


# --- pipeline: a 1F1B schedule generator --------------------------------------------------------------------

PIPELINE_CASES = [(4, 8), (4, 4), (3, 2), (2, 5), (1, 3)]


def as_schedule(lists, p: int, m: int) -> Schedule:
    """A learner's per-stage lists of ("F", i) / ("B", i) pairs as a `theory.schedules.Schedule` to simulate."""
    actions = []
    for stage in lists:
        acts = []
        for item in stage:
            kind, mb = item
            acts.append(Action(str(kind), int(mb)))
        actions.append(tuple(acts))
    return Schedule("yours", p, m, 1, tuple(actions))


@register("one_f_one_b", summary="every stage runs each micro-batch's F and B once, the schedule never "
          "deadlocks, its bubble is (p−1)/(m+p−1) and stage s holds at most min(p−s, m) activations (1F1B)")
def one_f_one_b_check(one_f_one_b) -> list[str]:
    for p, m in PIPELINE_CASES:
        lists = one_f_one_b(p, m)
        where = f"{p} stages, {m} micro-batches"
        if not isinstance(lists, (list, tuple)) or len(lists) != p:
            return [f"{where}: expected a list of {p} per-stage lists, got {type(lists).__name__}"
                    + (f" of length {len(lists)}" if isinstance(lists, (list, tuple)) else "")]
        for s, stage in enumerate(lists):
            try:
                pairs = [(str(k), int(i)) for k, i in stage]
            except (TypeError, ValueError):
                return [f"{where}, stage {s}: each action must be a pair like ('F', 0) or ('B', 3)"]
            for kind in "FB":
                mbs = sorted(i for k, i in pairs if k == kind)
                if mbs != list(range(m)):
                    return [f"{where}, stage {s}: the {kind} actions cover micro-batches {mbs}; expected each "
                            f"of 0..{m - 1} exactly once (off by one at the warm-up or cool-down?)"]
        try:
            result = simulate(as_schedule(lists, p, m))
        except ValueError as exc:
            return [f"{where}: your schedule cannot run: {exc}. Hint: a B needs its own F first, and stage s "
                    "cannot run F(i) before stage s−1 did"]
        from partrain_edu.theory.schedules import build_schedule   # the reference: in the grader only

        want = build_schedule("1f1b", p, m)
        reference = simulate(want)
        for s in range(p):
            if result.peak_activations[s] > reference.peak_activations[s]:
                order = " ".join(f"{k}{i}" for k, i in lists[s])
                return [f"{where}, stage {s}: holds {result.peak_activations[s]} micro-batches' activations at "
                        f"peak; 1F1B holds at most min(p − s, m) = {reference.peak_activations[s]}. Your order: "
                        f"{order}. Hint: warm up with p − s − 1 forwards, then alternate one F and one B"]
        if abs(result.bubble_fraction - reference.bubble_fraction) > 1e-9:
            return [f"{where}: bubble {result.bubble_fraction:.4f}, expected {reference.bubble_fraction:.4f} "
                    f"= (p−1)/(m+p−1) with t_B = 2 t_F"]
    return []

