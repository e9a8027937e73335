"""exercises/ and the grader's manifest are generated from solutions/ and up to date; `partrain-edu check
solutions --json` passes every check, `partrain-edu check exercises --json` fails every check cleanly with the
NotImplementedError message."""
import csv
import json
from pathlib import Path

import nbformat

from partrain_edu.cli import main
from partrain_edu.grading import check_names
from partrain_edu.grading.authoring.make_exercises import BEGIN, END, generate
from partrain_edu.grading.authoring.manifest import EXERCISES
from partrain_edu.grading.runner import spec_of

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


def test_exercises_are_generated_from_solutions_and_up_to_date():
    assert SOLUTIONS, "solutions/ has no notebooks"
    stale = generate(ROOT / "solutions", ROOT / "exercises", check_only=True)
    assert not stale, \
        f"exercises/ is out of date for {stale}: run python -m partrain_edu.grading.authoring.make_exercises"
    for path in SOLUTIONS:
        exercise = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
        code = [c for c in exercise.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code)
        text = "\n".join(c.source for c in code)
        assert BEGIN not in text and END not in text and "raise NotImplementedError(" in text


def test_the_manifest_owes_every_check_once_with_its_functions():
    assert list(EXERCISES) == [p.stem for p in SOLUTIONS]
    owed = [name for checks in EXERCISES.values() for name, _ in checks]
    assert sorted(owed) == check_names()
    for checks in EXERCISES.values():
        for name, functions in checks:
            spec_of(name, len(functions))  # a ValueError names a check that takes another number of functions


def _check(path, tmp_path, capfd) -> tuple[int, dict, list]:
    table = tmp_path / "grades.csv"
    code = main(["check", str(path), "--json", "--csv", str(table)])
    out, err = capfd.readouterr()  # at the file descriptors: what the grader's children write lands there too
    # The grading kernel is an in-process IPython shell, not a Jupyter kernel: no ZMQ transport, so none of
    # ipykernel's "[IPKernelApp] WARNING | Kernel is running over TCP without encryption" per notebook.
    assert "IPKernelApp" not in out + err and "without encryption" not in out + err
    report = json.loads(out)
    with open(table) as f:
        rows = list(csv.DictReader(f))
    return code, report, rows


def test_check_solutions_all_pass(tmp_path, capfd):
    code, report, rows = _check(ROOT / "solutions", tmp_path, capfd)
    assert [Path(nb["path"]).name for nb in report["notebooks"]] == [p.name for p in SOLUTIONS]
    failed = [(c["name"], c["message"]) for nb in report["notebooks"] for c in nb["checks"] if not c["passed"]]
    assert not failed
    assert code == 0 and all(nb["score"] == 1.0 for nb in report["notebooks"])
    assert {c["name"] for nb in report["notebooks"] for c in nb["checks"]} == set(check_names())
    assert len(rows) == len(check_names()) and all(r["passed"] == "1" for r in rows)


def test_check_exercises_all_fail_cleanly(tmp_path, capfd):
    code, report, rows = _check(ROOT / "exercises", tmp_path, capfd)
    assert code == 1
    checks = [c for nb in report["notebooks"] for c in nb["checks"]]
    assert {c["name"] for c in checks} == set(check_names())  # every check ran: nothing crashed before it
    for c in checks:
        assert not c["passed"] and "not implemented yet: write your answer here" in c["message"], c
    assert all(nb["score"] == 0.0 for nb in report["notebooks"])
    assert {r["passed"] for r in rows} == {"0"}
