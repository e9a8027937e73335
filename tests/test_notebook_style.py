"""The notebooks are teaching material: short lesson cells, no test markers or stale status in what a learner
reads, a kernel to run on, and every chapter pointing at its exercise (issue 16's checklist, as tests)."""
import json
import re
from pathlib import Path

import pytest

from partrain_edu.problems.bank import chapters, of_chapter

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LESSON_LINES = 15        # a lesson cell: one idea; plotting and bookkeeping live in partrain_edu.viz / helpers
RANK_PROGRAM_LINES = 20  # a %%torchrun / %%dist cell is a whole program every rank runs
STALE = ("NBVAL", "(planned)", "(coming)")
PROBLEMS_HEAD = "## Problems (习题)"
EXERCISE_OF = {f"0{n}": f"0{n}_" for n in range(1, 8)}   # chapter 0N ends with a link to exercises/0N_*


def cells(path):
    return json.loads(path.read_text())["cells"]


def lesson_cells(path):
    """The cells before the chapter's problem set (its last three cells, when it has one)."""
    found = cells(path)
    heads = [i for i, c in enumerate(found) if "".join(c["source"]).startswith(PROBLEMS_HEAD)]
    return found[:heads[0]] if heads else found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lesson_cells_are_short(path):
    long = []
    for i, cell in enumerate(cells(path)):
        source = "".join(cell["source"]).strip()
        if cell["cell_type"] != "code" or not source:
            continue
        limit = RANK_PROGRAM_LINES if source.startswith(("%%torchrun", "%%dist")) else LESSON_LINES
        if len(source.splitlines()) > limit:
            long.append(f"cell {i}: {len(source.splitlines())} lines (at most {limit})")
    assert not long, f"{path.name}: move plotting and bookkeeping into a helper: {long}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_test_markers_or_stale_status_in_what_the_learner_reads(path):
    found = [f"cell {i}: {word}" for i, cell in enumerate(cells(path)) for word in STALE
             if word in "".join(cell["source"])]
    assert not found, f"{path.name}: {found} (use cell metadata tags or tests/nbval_sanitize.cfg)"


def test_the_readme_has_no_stale_status():
    readme = (ROOT / "README.md").read_text()
    assert not [word for word in STALE[1:] if word in readme]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_notebook_names_its_kernel(path):
    spec = json.loads(path.read_text())["metadata"].get("kernelspec", {})
    assert spec.get("name") == "python3" and spec.get("language") == "python"


@pytest.mark.parametrize("chapter", sorted(EXERCISE_OF))
def test_each_chapter_ends_with_a_link_to_its_exercise(chapter):
    path = next(p for p in NOTEBOOKS if p.name.startswith(chapter + "_"))
    markdown = [c for c in lesson_cells(path) if c["cell_type"] == "markdown"]
    tail = "".join("".join(c["source"]) for c in markdown[-2:])
    exercise = next((ROOT / "exercises").glob(EXERCISE_OF[chapter] + "*.ipynb"))
    assert re.search(rf"\]\(\.\./exercises/{re.escape(exercise.name)}\)", tail), \
        f"{path.name}: the last cells should link to ../exercises/{exercise.name}"


def test_every_exercise_is_linked_from_a_chapter():
    text = "".join("".join(c["source"]) for path in NOTEBOOKS for c in cells(path) if c["cell_type"] == "markdown")
    linked = set(re.findall(r"\]\(\.\./exercises/([0-9a-z_]+\.ipynb)\)", text))
    exercises = {p.name for p in (ROOT / "exercises").glob("*.ipynb")}
    assert len(exercises) >= 12 and exercises <= linked, f"no chapter links to {sorted(exercises - linked)}"


@pytest.mark.parametrize("chapter", sorted(chapters()))
def test_each_chapter_ends_with_its_problem_set(chapter):
    """The heading, `problem_set` for this chapter, and `sheet.check` with one None per problem."""
    path = next(p for p in NOTEBOOKS if p.name.startswith(chapter + "_"))
    tail = ["".join(c["source"]) for c in cells(path)[-3:]]
    count = len(of_chapter(chapter))
    assert tail[0].startswith(PROBLEMS_HEAD), f"{path.name}: end with the problems, under {PROBLEMS_HEAD!r}"
    assert f'problem_set("{chapter}", seed=' in tail[1]
    answers = ", ".join(f"{k}: None" for k in range(1, count + 1))
    assert tail[2].startswith(f"sheet.check({{{answers}}})"), f"{path.name}: {count} answers, each None"
