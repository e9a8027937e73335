"""Exercise 06, a 1F1B pipeline schedule (流水线并行), in process: `one_f_one_b(p, m)` lists, per stage, the
order of its forwards ("F", i) and backwards ("B", i) for m micro-batches on p stages.

Graded on 5 (p, m) cases by simulating the schedule (theory.schedules.simulate, which the exercise hands out
with `as_schedule`, givens/pipeline_1f1b.py): every stage runs each micro-batch's F and B once, the schedule
never deadlocks, its bubble is (p−1)/(m+p−1), and stage s holds at most min(p − s, m) micro-batches'
activations (PipeDream-Flush, Narayanan et al. 2021). The reference schedule is built in the grader only.
"""
from __future__ import annotations

from partrain_edu.grading.givens.pipeline_1f1b import as_schedule
from partrain_edu.grading.registry import register
from partrain_edu.theory.schedules import simulate   # the sandbox's view has it

PIPELINE_CASES = [(4, 8), (4, 4), (3, 2), (2, 5), (1, 3)]


@register("one_f_one_b", summary="every stage runs each micro-batch's F and B once, the schedule never "
          "deadlocks, its bubble is (p−1)/(m+p−1) and stage s holds at most min(p−s, m) activations (1F1B)")
def verify(one_f_one_b, *, seed: int) -> list[str]:
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
