"""`partrain-edu check FILE` of one file that cannot be graded is bad input: exit 2, one line saying the file is
not a notebook (issue 30, L2). In a folder the same file is one failed row (test_grading_hostile.py)."""
import pytest

from partrain_edu.cli import main

NOT_NOTEBOOKS = ["", "{not json", "[]", '{"a": 1}', '{"cells": "oops"}', '{"cells": ["x"], "nbformat": 4}']


@pytest.mark.parametrize("text", NOT_NOTEBOOKS)
@pytest.mark.parametrize("flags", [[], ["--json"]])
def test_one_file_that_is_not_a_notebook_exits_2_in_one_line(tmp_path, capsys, text, flags):
    path = tmp_path / "01_ring_all_reduce.ipynb"
    path.write_text(text)
    assert main(["check", str(path), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert f"{path} is not a notebook" in err


def test_one_notebook_named_after_no_exercise_exits_2_naming_the_fix(tmp_path, capsys):
    path = tmp_path / "homework.ipynb"
    path.write_text('{"cells": [], "nbformat": 4, "nbformat_minor": 5, "metadata": {}}')
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot tell which exercise" in err and "--exercise" in err


def test_each_check_draws_a_fresh_seed_unless_seed_fixes_it(capsys):
    """The grader draws each check's configurations from a fresh seed and reports it; `--seed S` fixes it, so an
    instructor can grade the very same configurations again (exercise 03: in-process checks, no ranks)."""
    import json
    from pathlib import Path

    notebook = Path(__file__).resolve().parents[1] / "solutions" / "03_memory_zero_stage.ipynb"
    seeds = []
    for flags in ([], [], ["--seed", "12345"]):
        assert main(["check", str(notebook), "--json", *flags]) == 0
        checks = json.loads(capsys.readouterr().out)["notebooks"][0]["checks"]
        assert [c["passed"] for c in checks] == [True, True]
        seeds.append([c["seed"] for c in checks])
    assert seeds[0] != seeds[1] and seeds[2] == [12345, 12345]
