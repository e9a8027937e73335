"""Grading, in-process: the local checks accept the reference and catch wrong answers with the right message,
shown in IPython as the problem lines alone (no grader frame, no path); every multi-rank check has its observe
half on the ranks; the exercise generator strips answers; `partrain-edu check` rejects bad input with exit 2."""
import pytest
import torch

from partrain_edu.cli import main
from partrain_edu.grading import CHECKS, check, check_names, run_check
from partrain_edu.grading.authoring.make_exercises import strip_solution
from partrain_edu.grading.compare import differ
from partrain_edu.grading.registry import WRAP_COLUMNS


# Learners' answers, written out: the course's own references would be refused (imports.py).
def state_bytes(params, dp, zero):
    shard = -(-params // dp)
    weights, grads = 2 * (shard if zero >= 3 else params), 2 * (shard if zero >= 2 else params)
    return weights + grads + 12 * (shard if zero else params)


def lowest_stage(params, dp, device_bytes):
    return next((z for z in range(4) if state_bytes(params, dp, z) <= device_bytes), None)


def one_f_one_b(p, m):
    out = []
    for s in range(p):
        w = min(p - s - 1, m)
        acts = [("F", i) for i in range(w)]
        for i in range(m - w):
            acts += [("F", w + i), ("B", i)]
        out.append(acts + [("B", i) for i in range(m - w, m)])
    return out


def test_references_pass_and_print(capsys):
    for name, fn in [("model_state_bytes", state_bytes), ("zero_stage", lowest_stage),
                     ("one_f_one_b", one_f_one_b)]:
        check(name, fn)
        assert f"✓ {name} passed" in capsys.readouterr().out


@pytest.mark.parametrize("name, wrong, words", [
    ("model_state_bytes", lambda p, d, z: 16 * p // (d if z else 1), "divides 16 by N_d; ZeRO-1 shards the optimizer"),
    ("model_state_bytes", lambda p, d, z: state_bytes(p, d, z) - 4 * p * (z < 1), "Adam states"),
    ("model_state_bytes", lambda p, d, z: (2 + 2 + 12 // d) * p if z else 16 * p, "(12 // N_d)"),
    ("zero_stage", lambda p, d, b: next((z for z in (3, 2, 1, 0) if state_bytes(p, d, z) <= b), None),
     "LOWEST stage"),
    ("zero_stage", lambda p, d, b: next((z for z in range(4) if state_bytes(p, d, z) <= b), 3), "None"),
    ("one_f_one_b", lambda p, m: [[("F", i) for i in range(m)] + [("B", i) for i in range(m)] for _ in range(p)],
     "that is GPipe's order"),
    ("one_f_one_b", lambda p, m: [[("B", i) for i in range(m)] + [("F", i) for i in range(m)] for _ in range(p)],
     "deadlocks"),
    ("one_f_one_b", lambda p, m: [a[:-1] for a in one_f_one_b(p, m)], "off by one at the warm-up or cool-down"),
    ("one_f_one_b", lambda p, m: one_f_one_b(p, m)[:-1], "per-stage lists (one per stage), got list of length"),
])
def test_wrong_answers_are_caught(name, wrong, words):
    result = run_check(name, wrong)
    assert not result.passed
    assert words in result.message, result.message
    with pytest.raises(AssertionError, match=name):
        check(name, wrong)


def test_not_implemented_and_crashes_are_failures_not_errors():
    def todo(*args):
        raise NotImplementedError("write your answer here, then run the check below")

    result = run_check("groups_inside_node", todo)
    assert not result.passed and "not implemented yet: write your answer here" in result.message
    result = run_check("one_f_one_b", lambda p, m: 1 / 0)
    assert not result.passed and "ZeroDivisionError" in result.message


def test_bad_check_calls_raise_value_error():
    with pytest.raises(ValueError, match="unknown check 'nope'; pick one of"):
        run_check("nope", print)
    with pytest.raises(ValueError, match="takes 4 function"):
        run_check("tp_f_g", print)
    assert "define your function with `def`" in run_check("ring_all_reduce", lambda t, group=None: t).message
    assert {"ring_all_reduce", "ddp_buckets", "zero1_step", "tp_f_g", "tp_mlp"} <= set(check_names())


def test_a_failed_check_in_ipython_shows_only_the_learners_problem_lines(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    result = shell.run_cell("from partrain_edu.grading import check\n"
                            "check('groups_inside_node', lambda dp, tp, pp, g, order: {'tp': True, 'dp': False, "
                            "'pp': False}, seed=3)", store_history=False)
    assert isinstance(result.error_in_exec, AssertionError)  # still an AssertionError for pytest and nbval
    shown = capsys.readouterr().out
    lines = shown.splitlines()
    first_item = [lines[1]] + [line for line in lines[2:8] if line.startswith("    ")]  # wrapped under its "- "
    assert lines[0] == "✗ groups_inside_node failed:" and max(map(len, lines)) <= WRAP_COLUMNS, shown
    assert " ".join(part.strip() for part in first_item) == (
        "- groups_inside_node(4, 1, 2, 8, 'tp-dp-pp') (dp=4, tp=1, pp=2 in order 'tp-dp-pp' on 8-GPU nodes, 8 GPUs): "
        "dp groups expected inside one node, got crossing: e.g. dp group [4, 5, 6, 7] is all on node 0. Hint: in order "
        "'tp-dp-pp' (innermost first) rank = tp_rank + tp·(dp_rank + dp·pp_rank), so dp ranks are tp = 1 apart: a dp "
        "group stretches over tp·dp = 4 consecutive ranks, and a node holds 8."), shown
    assert "Traceback" not in shown and "runner.py" not in shown and "File " not in shown, shown


def test_every_multi_rank_check_has_an_observe_half_on_the_ranks():
    check_names()  # loads every exercise module (grading/checks/)
    multi_rank = {name for name, spec in CHECKS.items() if spec.nproc}
    assert {name for name, spec in CHECKS.items() if spec.observe} == multi_rank >= \
        {"ring_all_reduce", "ddp_buckets", "zero1_step", "tp_f_g", "tp_mlp"}


def test_differ_names_shape_index_and_ratio():
    expected = torch.arange(1.0, 7.0).reshape(2, 3)
    assert differ("x", expected, expected.clone()) is None
    assert "expected shape (2, 3), got shape (3, 2)" in differ("x", expected, expected.T)
    message = differ("x", expected, 2 * expected)
    assert "6 of 6 values differ" in message and "first at flat index 0" in message and "2× the expected" in message


def test_strip_solution_keeps_indentation_and_signature():
    source = "def f(x):\n    \"\"\"doc\"\"\"\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n\nf"
    stripped = strip_solution(source)
    assert stripped == ("def f(x):\n    \"\"\"doc\"\"\"\n    # YOUR CODE HERE\n"
                        "    raise NotImplementedError(\"write your answer here, then run the check below\")\n\nf")
    compile(stripped, "cell", "exec")
    with pytest.raises(ValueError, match="never closed"):
        strip_solution("### BEGIN SOLUTION\nx = 1")
    with pytest.raises(ValueError, match="without a"):
        strip_solution("### END SOLUTION")


def test_check_command_bad_input_exits_2(tmp_path, capsys):
    assert main(["check", str(tmp_path / "missing")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("hi")
    assert main(["check", str(tmp_path / "notes.txt")]) == 2
    assert main(["check", str(tmp_path)]) == 2
    assert "no .ipynb notebooks" in capsys.readouterr().err


def test_an_endless_loop_in_process_ends_in_a_message():
    def forever(p, m):
        while True:
            pass

    result = run_check("one_f_one_b", forever, timeout=0.5)
    assert not result.passed and "ran longer than 0.5 s: an endless loop?" in result.message
