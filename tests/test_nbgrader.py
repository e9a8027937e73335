"""nbgrader takes the course as it is: in a course directory laid out from solutions/ (nbgrader_config.py),
nbgrader's own `generate_assignment` releases exactly exercises/, and its `autograde` scores each check cell of a
submission as `partrain-edu check` scores that check — for a solution, a blank exercise and a half-right answer,
on an in-process exercise (03) and a 4-rank one (01). Each tool runs once, as an instructor would run it, on all
of them ("*": every assignment, every student)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from partrain_edu.grading.authoring.make_exercises import BEGIN, END, generate, nbgrader_metadata
from partrain_edu.grading.authoring.nbgrader_config import lay_out

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXERCISES = ["01_ring_all_reduce", "03_memory_zero_stage"]
# alice hands in the solution; bob the blank exercise, or this wrong answer (old, new) where there is one:
WRONG = {"03_memory_zero_stage": ("for zero in range(4):", "for zero in reversed(range(4)):")}  # highest stage
EXPECTED = {  # (student, exercise) -> check -> passed: a test that cannot fail would check nothing
    ("alice", "01_ring_all_reduce"): {"ring_all_reduce": True},
    ("bob", "01_ring_all_reduce"): {"ring_all_reduce": False},
    ("alice", "03_memory_zero_stage"): {"model_state_bytes": True, "zero_stage": True},
    ("bob", "03_memory_zero_stage"): {"model_state_bytes": True, "zero_stage": False},
}


def _nbgrader(course: Path, *args: str) -> subprocess.CompletedProcess:
    # nbgrader runs `alembic` from PATH when it creates the gradebook: the venv's, as on an activated venv.
    # The user's own Jupyter config and kernels (~/.jupyter, ~/.local/share/jupyter) stay out of it.
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "JUPYTER_CONFIG_DIR": str(course / ".jupyter"), "JUPYTER_DATA_DIR": str(course / ".jupyter-data")}
    done = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    return done


def _answered(release: nbformat.NotebookNode, solution: nbformat.NotebookNode, edit=None):
    """The released notebook with each answer cell typed in as the solution has it (markers dropped): what a
    learner hands in. `edit` (old, new) makes it wrong."""
    nb = nbformat.from_dict(release)
    answers = {c.metadata.nbgrader["grade_id"]: c.source for c in solution.cells
               if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            lines = answers[grade_id].split("\n")
            cell.source = "\n".join(line for line in lines if line.strip() not in (BEGIN, END))
            if edit:
                assert edit[0] in cell.source
                cell.source = cell.source.replace(*edit)
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> tuple[Path, dict, dict]:
    """(course, nbgrader's scores, partrain-edu check's verdicts), each by (student, exercise) and check."""
    pytest.importorskip("nbgrader", reason="nbgrader is in the dev extra: pip install -e '.[dev]'")
    from nbgrader.api import Gradebook

    course = tmp_path_factory.mktemp("course")
    assert lay_out(course, names=EXERCISES) == EXERCISES
    _nbgrader(course, "generate_assignment", "*")
    for exercise in EXERCISES:
        release = nbformat.read(course / "release" / exercise / f"{exercise}.ipynb", as_version=4)
        solution = nbformat.read(ROOT / "solutions" / f"{exercise}.ipynb", as_version=4)
        wrong = _answered(release, solution, WRONG[exercise]) if exercise in WRONG else release
        for who, nb in (("alice", _answered(release, solution)), ("bob", wrong)):
            target = course / "submitted" / who / exercise / f"{exercise}.ipynb"
            target.parent.mkdir(parents=True)
            nbformat.write(nb, target)
    # partrain-edu check grades the same files while nbgrader does (two processes: half the waiting).
    check = subprocess.Popen([sys.executable, "-m", "partrain_edu", "check", str(course / "submitted"), "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _nbgrader(course, "autograde", "*")  # every assignment, every student (created as it goes)
        out, err = check.communicate(timeout=300)
    except BaseException:
        os.killpg(check.pid, signal.SIGKILL)  # the grader and whatever it started, should nbgrader fail
        check.wait()
        raise
    assert check.returncode in (0, 1), err[-3000:]
    ours = {}
    for row in json.loads(out)["notebooks"]:
        path = Path(row["path"])
        ours[path.parts[-3], row["exercise"]] = {c["name"]: c["passed"] for c in row["checks"]}
    theirs = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for student, exercise in ours:
            notebook = gradebook.find_submission_notebook(exercise, exercise, student)
            # (score, out of, left for a person to grade) per grade cell
            theirs[student, exercise] = {g.name: (g.score, g.max_score, g.needs_manual_grade)
                                         for g in notebook.grades}
    return course, theirs, ours


@pytest.mark.parametrize("exercise", EXERCISES)
def test_generate_assignment_releases_exactly_the_exercise(graded, exercise):
    course, _, _ = graded
    released = (course / "release" / exercise / f"{exercise}.ipynb").read_text()
    assert released == (ROOT / "exercises" / f"{exercise}.ipynb").read_text(), \
        "nbgrader releases another notebook than exercises/ holds: " \
        "run python -m partrain_edu.grading.authoring.make_exercises"


def test_autograde_scores_each_check_as_partrain_edu_check_does(graded):
    _, theirs, ours = graded
    assert ours == EXPECTED, "partrain-edu check's verdicts"
    as_nbgrader_scores = {key: {name: (float(passed), 1.0, False) for name, passed in checks.items()}
                          for key, checks in ours.items()}
    assert theirs == as_nbgrader_scores, "nbgrader's (score, points, needs a person) per check cell"


def _tiny_solution(*cells: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells],
                                    metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})


def test_the_generator_gives_a_new_solution_its_nbgrader_metadata(tmp_path):
    solutions, exercises = tmp_path / "solutions", tmp_path / "exercises"
    solutions.mkdir()
    answer = f"def f(x):\n    {BEGIN}\n    return x\n    {END}"
    nbformat.write(_tiny_solution("from partrain_edu.grading import check", answer, 'check("tiny", f)'),
                   solutions / "99_tiny.ipynb")
    manifest = tmp_path / "manifest.py"
    assert "solutions/99_tiny.ipynb" in generate(solutions, exercises, check_only=True, manifest=manifest)
    generate(solutions, exercises, manifest=manifest)
    assert generate(solutions, exercises, check_only=True, manifest=manifest) == []
    solution = nbformat.read(solutions / "99_tiny.ipynb", as_version=4)
    assert [c.metadata.get("nbgrader") for c in solution.cells] == [
        None,
        {"grade": False, "grade_id": "answer_f", "locked": False, "schema_version": 3, "solution": True,
         "task": False},
        {"grade": True, "grade_id": "tiny", "locked": True, "points": 1, "schema_version": 3, "solution": False,
         "task": False}]
    exercise = nbformat.read(exercises / "99_tiny.ipynb", as_version=4)
    assert exercise.cells[2].metadata["editable"] is False and len(exercise.cells[2].metadata.nbgrader.checksum) == 32


@pytest.mark.parametrize("cells, words", [
    (['check("a", f)\ncheck("b", f)'], "one check(...) per cell"),
    ([f"def f():\n    {BEGIN}\n    pass\n    {END}\ncheck('a', f)"], "in a cell of its own"),
    ([f"x = 1  {BEGIN}"], "must stand alone on its line"),
])
def test_what_nbgrader_could_not_grade_apart_is_refused(cells, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        nbgrader_metadata(_tiny_solution(*cells))
