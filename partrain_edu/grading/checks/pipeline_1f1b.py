"""Exercise 06, a 1F1B pipeline schedule (流水线并行), in process: `one_f_one_b(p, m)` lists, per stage, the
order of its forwards ("F", i) and backwards ("B", i) for m micro-batches on p stages.

Graded on 8 (p, m) drawn per run (trials.py) from 2 ≤ p ≤ 8: always one with m < p − 1 (fewer micro-batches
than stage 0's warm-up), one with m = 1, one with m = p − 1, one with m = p and the rest with p < m ≤ 4p.
For each, in the order a learner should fix them: the lists have the form asked for; every stage runs each
micro-batch 0..m−1's F and B exactly once and nothing else; the schedule runs without deadlock (simulated by
theory.schedules.simulate, which the exercise hands out with `as_schedule`, givens/pipeline_1f1b.py); stage s
holds at most min(p − s, m) micro-batches' activations; and its bubble is (p−1)/(m+p−1) with t_B = 2 t_F,
the least any order of these actions reaches (PipeDream-Flush, Narayanan et al. 2021 §2.2.1). The expected
values are the lesson's formulas, computed here; no message prints an order of actions but the learner's own.
"""
from __future__ import annotations

import operator
from collections import Counter

from partrain_edu.grading.givens.pipeline_1f1b import as_schedule
from partrain_edu.grading.registry import LearnerError, Problem, register
from partrain_edu.grading.trials import stream
from partrain_edu.theory.schedules import simulate  # the sandbox's view has it

MOST_STAGES, CASES = 8, 8
# What a problem is about, in the order to fix them: one (level, p, m) orders the problems of a run.
FORM, COVER, DEADLOCK, PEAK, BUBBLE = range(5)


def cases(seed: int) -> list[tuple[int, int]]:
    """The run's (p, m), smallest first: the edge cases of the warm-up (m < p − 1, m = 1, m = p − 1, m = p),
    then m > p. About 140 pairs are possible, so one run's list says little about the next one's."""
    rng = stream(seed, "one_f_one_b")
    p = rng.randint(3, MOST_STAGES)
    drawn = {(p, rng.randint(1, p - 2))}             # stage 0's warm-up would ask for micro-batches past m
    drawn.add((rng.randint(2, MOST_STAGES), 1))      # no steady phase anywhere
    p = rng.randint(2, MOST_STAGES)
    drawn.add((p, p - 1))                            # stage 0 warms up with all of them
    p = rng.randint(2, MOST_STAGES)
    drawn.add((p, p))
    while len(drawn) < CASES:
        p = rng.randint(2, MOST_STAGES)
        drawn.add((p, rng.randint(p + 1, 4 * p)))
    return sorted(drawn)


def _listed(values, most: int = 8) -> str:
    values = list(values)
    return "[" + ", ".join(map(str, values[:most])) + (", …]" if len(values) > most else "]")


def _numbers(m: int) -> str:
    return "micro-batch 0 only" if m == 1 else f"micro-batches 0..{m - 1}"


def _order(stage: list[tuple[str, int]], most: int = 24) -> str:
    return " ".join(f"{k}{i}" for k, i in stage[:most]) + (" …" if len(stage) > most else "")


def _lead(stage: list[tuple[str, int]]) -> int:
    """How many forwards a stage runs before its first backward."""
    return next((n for n, (kind, _) in enumerate(stage) if kind == "B"), len(stage))


def _form(lists, p: int, where: str) -> list[list[tuple[str, int]]] | str:
    """The learner's lists as [(kind, micro-batch)] per stage, or what is wrong with their form."""
    if not isinstance(lists, (list, tuple)) or len(lists) != p:
        size = f" of length {len(lists)}" if isinstance(lists, (list, tuple)) else ""
        return f"{where}: expected a list of {p} per-stage lists (one per stage), got {type(lists).__name__}{size}"
    out = []
    for s, stage in enumerate(lists):
        if not isinstance(stage, (list, tuple)):
            return f"{where}, stage {s}: expected a list of actions, got {type(stage).__name__}"
        pairs = []
        for item in stage:
            try:
                kind, mb = item
                if not isinstance(kind, str) or kind not in ("F", "B") or isinstance(mb, bool):
                    raise ValueError
                pairs.append((kind, operator.index(mb)))
            except (TypeError, ValueError):
                return f"{where}, stage {s}: each action must be a pair like ('F', 0) or ('B', 3), got {item!r:.40}"
        out.append(pairs)
    return out


def _coverage(stage: list[tuple[str, int]], s: int, p: int, m: int, where: str) -> str | None:
    """What is wrong with the micro-batches stage s runs (each of 0..m−1 once per kind, nothing else)."""
    for kind in "FB":
        count = Counter(i for k, i in stage if k == kind)
        absent = sorted(i for i in count if not 0 <= i < m)
        if absent:
            # The evidence of an uncapped warm-up: the stage's leading forwards number p − s − 1 > m.
            hint = (f". Hint: it runs p − s − 1 = {p - s - 1} warm-up forwards, more than m = {m}: the warm-up is "
                    "min(p − s − 1, m) forwards" if kind == "F" and p - s - 1 > m
                    and _lead(stage) == p - s - 1 else "")
            return (f"{where}, stage {s}: its {kind} actions name micro-batch(es) {_listed(absent)}, which do not "
                    f"exist: m = {m} means {_numbers(m)}{hint}")
        missing = [i for i in range(m) if not count[i]]
        twice = [i for i in range(m) if count[i] > 1]
        if missing or twice:
            said = " and ".join(part for part in (missing and f"leave out micro-batch(es) {_listed(missing)}",
                                                   twice and f"run micro-batch(es) {_listed(twice)} more than once")
                                if part)
            edge = not twice and missing in ([0], [m - 1])
            return (f"{where}, stage {s}: its {kind} actions {said}; it must run each of the m = {m} exactly "
                    "once" + (" (off by one at the warm-up or cool-down?)" if edge else ""))
    return None


def _deadlock(stages: list[list[tuple[str, int]]], error: ValueError, where: str) -> str:
    for s, stage in enumerate(stages):
        ran = set()
        for kind, i in stage:
            if kind == "B" and i not in ran:
                return (f"{where}: the schedule deadlocks: stage {s} runs B{i} before its own F{i}. Hint: a "
                        "micro-batch's backward needs its forward's activations")
            if kind == "F":
                ran.add(i)
    waits = str(error).split("deadlocks: ", 1)[-1].split("; reorder", 1)[0].replace(" chunk 0", "")
    return (f"{where}: the schedule deadlocks: {waits}. Hint: stage s runs F(i) only after stage s − 1 has, and "
            "B(i) only after stage s + 1 has: a stage that runs a backward before the forward its neighbour "
            "waits for stops both")


def _peak(stage: list[tuple[str, int]], s: int, p: int, m: int, held: int, where: str) -> str:
    bound = min(p - s, m)
    lead = _lead(stage)
    if lead == m:
        why = " — all its forwards run before any backward: that is GPipe's order, which holds all m"
    elif lead > p - s:
        why = (f" — it runs {lead} forwards before its first backward; 1F1B runs p − s = {p - s} (p − s − 1 "
               "warm-up forwards, then the first forward of the steady phase)")
    else:
        why = ". Hint: after the warm-up, alternate one forward and one backward: each backward frees one"
    return (f"{where}, stage {s}: holds {held} micro-batches' activations at its peak; 1F1B holds at most "
            f"min(p − s, m) = {bound}. Your order: {_order(stage)}{why}")


def _bubble(stages: list[list[tuple[str, int]]], p: int, m: int, got: float, where: str) -> str:
    want = (p - 1) / (m + p - 1)
    short = [s for s, stage in enumerate(stages) if _lead(stage) < min(p - s, m)]
    why = (f" Stage {short[0]} runs only {_lead(stages[short[0]])} forward(s) before its first backward, where "
           f"1F1B runs min(p − s, m) = {min(p - short[0], m)}: its neighbours wait on it. Warm up with "
           "min(p − s − 1, m) forwards" if short else
           " Hint: a stage that waits for a neighbour while it could compute adds to the bubble")
    return (f"{where}: bubble {got:.4f}, above 1F1B's (p − 1)/(m + p − 1) = {want:.4f} (simulated with "
            f"t_B = 2 t_F).{why}")


def _where(p: int, m: int) -> str:
    return f"{p} stages, {m} micro-batch{'es' if m > 1 else ''}"


def _called(one_f_one_b, p: int, m: int):
    """The learner's lists for (p, m); a crash is told with the (p, m) it happened on."""
    try:
        return one_f_one_b(p, m)
    except NotImplementedError:
        raise
    except LearnerError as exc:   # the headless grader's word for a crash in the sandbox; or a time limit
        if str(exc).startswith("your code raised"):
            raise LearnerError(f"{_where(p, m)}: {exc}") from None
        raise
    except Exception as exc:
        raise LearnerError(f"{_where(p, m)}: your code raised {type(exc).__name__}: {exc}") from None


def grade(lists, p: int, m: int) -> Problem | None:
    """The first problem of the learner's schedule for (p, m), by level (form, cover, deadlock, peak, bubble)."""
    where = _where(p, m)
    stages = _form(lists, p, where)
    if isinstance(stages, str):
        return Problem(stages, at=(FORM, p, m))
    for s, stage in enumerate(stages):
        problem = _coverage(stage, s, p, m, where)
        if problem:
            return Problem(problem, at=(COVER, p, m))
    try:
        result = simulate(as_schedule(stages, p, m))
    except ValueError as error:
        return Problem(_deadlock(stages, error, where), at=(DEADLOCK, p, m))
    for s in range(p):
        if result.peak_activations[s] > min(p - s, m):
            return Problem(_peak(stages[s], s, p, m, result.peak_activations[s], where), at=(PEAK, p, m))
    if result.bubble_fraction > (p - 1) / (m + p - 1) + 1e-9:   # no order of these actions does better
        return Problem(_bubble(stages, p, m, result.bubble_fraction, where), at=(BUBBLE, p, m))
    return None


@register("one_f_one_b", summary="on (p, m) drawn afresh, with m < p − 1, m = 1 and m ≥ p among them, every stage "
          "runs each micro-batch's F and B once and nothing else, the schedule never deadlocks, stage s holds at "
          "most min(p−s, m) micro-batches' activations and the bubble is (p−1)/(m+p−1) (1F1B)")
def verify(one_f_one_b, *, seed: int) -> list[str]:
    problems = [problem for p, m in cases(seed) if (problem := grade(_called(one_f_one_b, p, m), p, m))]
    # The most basic kind of problem first (a wrong form before a wrong bubble), on its smallest (p, m).
    return [min(problems, key=lambda problem: problem.at)] if problems else []
