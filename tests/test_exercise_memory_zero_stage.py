"""Exercise 3, model states under ZeRO (in-process): the solution passes on several seeds; every run draws each
stage, a padded shard and a single device (model_state_bytes) and each answer 0–3 and None, with budgets exactly
at a stage's need (zero_stage); wrong answers fail naming the earliest wrong quantity — bytes per parameter, which
terms a stage shards, the padding, ≤ at the boundary, the lowest stage, None — and a table of the answers the
messages of a few runs handed out fails the next run."""
import re

from exercise_sources import solution_source
from partrain_edu.grading import run_check
from partrain_edu.grading.checks.memory_zero_stage import reference_stage, reference_total, stage_cases, state_cases

NOTEBOOK = "03_memory_zero_stage"


def live(name: str):
    """The solution's functions as one notebook cell defines them (smallest_zero_stage calls model_state_bytes)."""
    namespace = {}
    exec(compile(solution_source(NOTEBOOK, "model_state_bytes").text + "\n\n"
                 + solution_source(NOTEBOOK, "smallest_zero_stage").text, "<cell>", "exec"), namespace)
    return namespace[name]


def state_bytes(params, dp, zero, shard=None, sharded_from=(3, 2, 1)):
    """A learner's model_state_bytes: weights, gradients, optimizer sharded from the stages `sharded_from`."""
    shard = -(-params // dp) if shard is None else shard
    w, g, o = sharded_from
    return 2 * (shard if zero >= w else params) + 2 * (shard if zero >= g else params) + \
        12 * (shard if zero >= o else params)


def failure(name, fn, seed=7) -> str:
    result = run_check(name, fn, seed=seed)
    assert not result.passed
    return result.message


def test_the_solution_passes_on_several_seeds():
    for seed in (1, 2, 3):
        assert run_check("model_state_bytes", live("model_state_bytes"), seed=seed).passed
        assert run_check("zero_stage", live("smallest_zero_stage"), seed=seed).passed


def test_every_run_draws_every_stage_padding_one_device_and_every_answer():
    for seed in range(30):
        states = state_cases(seed)
        stages = [z for _, _, z in states]
        assert set(stages) == {0, 1, 2, 3} and stages == sorted(stages)   # graded stage 0 first
        assert all(any(p % d and z == stage for p, d, z in states) for stage in (1, 2, 3))   # a padded shard
        assert any(d == 1 and z > 0 for _, d, z in states)
        budgets = stage_cases(seed)
        answers = [reference_stage(*case) for case in budgets]
        assert set(answers) == {0, 1, 2, 3, None}
        exact = {reference_stage(p, d, b) for p, d, b in budgets if any(reference_total(p, d, z) == b
                                                                         for z in range(4))}
        assert exact >= {0, 1, 2, 3}
    assert len({case for seed in range(30) for case in state_cases(seed)}) == 30 * 9   # no two runs share a case


def test_sharding_everything_at_stage_1_names_the_terms_stage_1_shards():
    text = failure("model_state_bytes", lambda p, d, z: 16 * p // (d if z else 1))
    assert "ZeRO-1): expected" in text
    assert "at ZeRO-1 your answer keeps 0 bytes per parameter whole on every device and divides 16 by N_d" in text
    assert "ZeRO-1 shards the optimizer states (12) and keeps the weights and gradients (2 + 2) whole" in text


def test_gradients_sharded_a_stage_early_is_named_at_stage_1():
    text = failure("model_state_bytes", lambda p, d, z: state_bytes(p, d, z, sharded_from=(3, 1, 1)))
    assert "ZeRO-1" in text and "divides 14 by N_d" in text and "keeps the weights and gradients (2 + 2)" in text


def test_a_missing_adam_state_is_named_by_its_bytes_per_parameter_at_stage_0():
    text = failure("model_state_bytes", lambda p, d, z: state_bytes(p, d, z) - 4 * p * (z < 1))
    assert "ZeRO-0" in text and "your answer keeps 12 bytes per parameter" in text
    assert "fp32 Adam states (master weights, momentum, variance) 4 + 4 + 4" in text


def test_a_shard_rounded_down_is_named_where_n_d_does_not_divide_psi():
    text = failure("model_state_bytes", lambda p, d, z: state_bytes(p, d, z, shard=p // d))
    found = re.search(r"model_state_bytes\((\d+), (\d+), [123]\)", text)
    assert found and int(found[1]) % int(found[2])
    assert "right where N_d divides Ψ, wrong here where it does not" in text and "⌈Ψ/N_d⌉" in text


def test_a_float_shard_and_an_integer_division_of_12_fail_with_their_own_hints():
    text = failure("model_state_bytes", lambda p, d, z: 2 * p + 2 * p + 12 * (p / d if z else p))
    assert "expected an int, a number of bytes, got" in text and "not Ψ / N_d" in text
    text = failure("model_state_bytes", lambda p, d, z: (2 + 2 + 12 // d) * p if z else 16 * p)
    assert "not a·Ψ + b·Ψ/N_d for any a, b" in text and "12 // N_d" in text


def test_the_highest_fitting_stage_is_told_to_return_the_lowest():
    text = failure("zero_stage", lambda p, d, b: next((z for z in (3, 2, 1, 0) if state_bytes(p, d, z) <= b), None))
    assert "fits, but so does a lower stage: return the LOWEST stage" in text


def test_a_strict_comparison_fails_at_the_boundary_with_the_le_hint():
    text = failure("zero_stage", lambda p, d, b: next((z for z in range(4) if state_bytes(p, d, z) < b), None))
    found = re.search(r"smallest_zero_stage\((\d+), (\d+), (\d+)\).*expected (\d)", text)
    assert found and reference_total(*map(int, found.groups()[:2]), int(found[4])) == int(found[3])
    assert "take exactly the device's bytes, and that fits: compare with ≤, not <" in text


def test_stage_3_instead_of_none_and_a_constant_fail():
    text = failure("zero_stage", lambda p, d, b: next((z for z in range(4) if state_bytes(p, d, z) <= b), 3))
    assert "expected None, got 3" in text and "return None when no stage fits" in text
    assert "expected" in failure("zero_stage", lambda p, d, b: 1)
    assert "expected a stage 0, 1, 2 or 3, or None, got 'one'" in failure("zero_stage", lambda p, d, b: "one")


def test_a_table_of_the_answers_a_few_runs_named_fails_the_next_run():
    bytes_table, stage_table = {}, {}

    def bytes_replay(params, dp, zero):
        return bytes_table.get((params, dp, zero), 16 * params)

    def stage_replay(params, dp, device_bytes):
        return stage_table.get((params, dp, device_bytes), 0)

    for seed in (11, 12, 13):   # fix each named case until the run passes, as a learner reading messages would
        for _ in range(12):
            result = run_check("model_state_bytes", bytes_replay, seed=seed)
            if result.passed:
                break
            found = re.search(r"model_state_bytes\((\d+), (\d+), (\d)\).*?expected ([\d,]+) bytes", result.message)
            bytes_table[tuple(map(int, found.groups()[:3]))] = int(found[4].replace(",", ""))
        for _ in range(12):
            result = run_check("zero_stage", stage_replay, seed=seed)
            if result.passed:
                break
            found = re.search(r"smallest_zero_stage\((\d+), (\d+), (\d+)\).*expected (\w+)", result.message)
            stage_table[tuple(map(int, found.groups()[:3]))] = None if found[4] == "None" else int(found[4])
    assert len(bytes_table) >= 9 and len(stage_table) >= 9   # every run's cases were learnt, and passed
    assert run_check("model_state_bytes", bytes_replay, seed=13).passed
    assert not run_check("model_state_bytes", bytes_replay, seed=14).passed
    assert not run_check("zero_stage", stage_replay, seed=14).passed
