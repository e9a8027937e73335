"""Exercise 06, a 1F1B schedule generator (in process): the solution passes on several seeds; every run draws
the warm-up's edge cases (m < p − 1, m = 1, m = p − 1, m = p) and m > p from 2 ≤ p ≤ 8; the formulas the check
grades against are what the course's own 1F1B simulates to; each kind of wrong schedule fails on the earliest
wrong quantity (form, micro-batches covered, deadlock, peak activations, bubble) with a hint only where its
evidence is; and a table of schedules for the (p, m) a few runs' messages named fails the next run."""
import re

import pytest

from exercise_sources import solution_source
from partrain_edu.grading import run_check
from partrain_edu.grading.checks.pipeline_1f1b import CASES, MOST_STAGES, cases
from partrain_edu.theory.schedules import build_schedule, simulate

NAME = "one_f_one_b"
SEED = 2024
namespace: dict = {}
exec(solution_source("06_pipeline_1f1b", NAME).text, namespace)
SOLUTION = namespace[NAME]


def schedule(p, m, warmup=lambda p, m, s: min(p - s - 1, m)):
    """1F1B written out, with the warm-up of stage s a parameter (the wrong answers below change it)."""
    out = []
    for s in range(p):
        w = warmup(p, m, s)
        acts = [("F", i) for i in range(w)]
        for i in range(m - w):
            acts += [("F", w + i), ("B", i)]
        out.append(acts + [("B", i) for i in range(m - w, m)])
    return out


def message(answer, seed: int = SEED) -> str:
    result = run_check(NAME, answer, seed=seed)
    assert not result.passed, "a wrong answer passed"
    return result.message


def test_the_solution_passes_on_several_seeds():
    for seed in (1, 2, 3):
        assert run_check(NAME, SOLUTION, seed=seed).passed


def test_every_run_draws_the_warm_ups_edge_cases_and_more_micro_batches_than_stages():
    for seed in range(40):
        drawn = cases(seed)
        assert len(drawn) == len(set(drawn)) == CASES
        assert all(2 <= p <= MOST_STAGES and m >= 1 for p, m in drawn)
        assert any(m < p - 1 for p, m in drawn) and any(m == 1 for _, m in drawn)
        assert any(m == p for p, m in drawn) and any(m > p for p, m in drawn)
    assert len({pm for seed in range(40) for pm in cases(seed)}) > 100   # no small table covers the runs


def test_the_graded_formulas_are_what_the_course_1f1b_simulates_to():
    for p in range(2, MOST_STAGES + 1):
        for m in range(1, 4 * p + 1):
            result = simulate(build_schedule("1f1b", p, m))
            assert list(result.peak_activations) == [min(p - s, m) for s in range(p)]
            assert result.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)


def test_a_warm_up_not_capped_at_m_names_the_micro_batches_that_do_not_exist():
    text = message(lambda p, m: schedule(p, m, lambda p, m, s: p - s - 1))
    assert re.search(r"stage 0: its F actions name micro-batch\(es\) \[[0-9, ]+\], which do not exist: m = ", text)
    assert "more than m = " in text and "the warm-up is min(p − s − 1, m) forwards" in text


def test_gpipe_fails_on_its_peak_of_activations():
    text = message(lambda p, m: [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)])
    assert "micro-batches' activations at its peak; 1F1B holds at most min(p − s, m) = " in text
    assert "that is GPipe's order" in text


def test_one_warm_up_forward_too_many_fails_on_the_peak_with_the_count():
    text = message(lambda p, m: schedule(p, m, lambda p, m, s: min(p - s, m)))
    found = re.search(r"(\d+) stages, \d+ micro-batches, stage (\d+): holds (\d+) .* it runs (\d+) forwards before "
                      r"its first backward; 1F1B runs p − s = (\d+)", text)
    assert found, text
    p, s, held, lead, bound = map(int, found.groups())
    assert held == lead == bound + 1 == p - s + 1


def test_no_warm_up_fails_on_the_bubble():
    text = message(lambda p, m: schedule(p, m, lambda p, m, s: 0))
    assert "above 1F1B's (p − 1)/(m + p − 1) = " in text and "Stage 0 runs only 1 forward(s) before its first" in text


def test_backwards_before_forwards_and_a_crossed_order_deadlock():
    text = message(lambda p, m: [[("B", i) for i in range(m)] + [("F", i) for i in range(m)] for _ in range(p)])
    assert "1 micro-batch: the schedule deadlocks: stage 0 runs B0 before its own F0" in text

    def crossed(p, m):   # stage 0 without warm-up, stage 1 in GPipe's order: each waits on the other
        out = schedule(p, m)
        out[0] = schedule(p, m, lambda p, m, s: 0)[0]
        out[1] = [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
        return out
    assert "the schedule deadlocks: stage 0 waits at B0, stage 1 waits at F1" in message(crossed)


def test_a_dropped_last_backward_is_an_off_by_one():
    text = message(lambda p, m: [stage[:-1] for stage in schedule(p, m)])
    assert "stage 0: its B actions leave out micro-batch(es) [0]" in text  # m = 1 is the smallest case
    assert "off by one at the warm-up or cool-down" in text


def test_answers_for_one_setup_or_of_the_wrong_form_fail():
    assert "per-stage lists (one per stage), got list of length 4" in message(lambda p, m: schedule(4, 8))
    assert "per-stage lists (one per stage), got list of length" in message(lambda p, m: schedule(p, m)[:-1])
    text = message(lambda p, m: [[f"{k}{i}" for k, i in stage] for stage in schedule(p, m)])
    assert "each action must be a pair like ('F', 0) or ('B', 3), got 'F0'" in text
    # right everywhere but on one micro-batch
    assert re.search(r"\d stages, 1 micro-batch: your code raised ZeroDivisionError",
                     message(lambda p, m: schedule(p, m) if m > 1 else 1 / 0))


def test_a_table_for_the_cases_a_few_runs_named_fails_the_next_run():
    table = {}

    def replay(p, m):
        return table.get((p, m), [])

    for seed in (11, 12, 13):   # fix each named (p, m) until the run passes, as a learner reading messages would
        for _ in range(CASES + 1):
            result = run_check(NAME, replay, seed=seed)
            if result.passed:
                break
            p, m = map(int, re.search(r"- (\d+) stages, (\d+) micro-batch", result.message).groups())
            table[p, m] = schedule(p, m)
        assert result.passed
    assert len(table) >= 2 * CASES
    text = message(replay, seed=14)
    p, m = map(int, re.search(r"- (\d+) stages, (\d+) micro-batch", text).groups())
    assert (p, m) not in table and "expected a list of" in text
