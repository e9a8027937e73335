"""A class set exported for nbgrader (`partrain-edu problems export`): nbgrader's own generate_assignment releases
it without a key, and its autograde gives a point for each answer the course's `grade` accepts — all for the
keys, none for answers off by the bits-for-bytes factor, none for a blank release."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from partrain_edu.cli import main
from partrain_edu.problems.bank import draw, of_chapter
from partrain_edu.problems.export import variable

BIN = Path(sys.executable).parent
SEED = 11
NAME = f"problems_seed{SEED}"


def _nbgrader(course: Path, *args: str) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "JUPYTER_CONFIG_DIR": str(course / ".jupyter"), "JUPYTER_DATA_DIR": str(course / ".jupyter-data")}
    done = subprocess.run([str(BIN / "nbgrader"), *args], cwd=course, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


def _answered(release: nbformat.NotebookNode, factor: float) -> nbformat.NotebookNode:
    """The released notebook with each answer cell typed in as the key times `factor`."""
    nb = nbformat.from_dict(release)
    keys = {variable(p.id): draw(p.id, SEED).answer for p in of_chapter("01")}
    for cell in nb.cells:
        name = cell.metadata.get("nbgrader", {}).get("grade_id")
        if name in keys:
            cell.source = f"{name} = {keys[name] * factor!r}"
    return nb


def test_nbgrader_releases_the_class_set_without_keys_and_scores_it_as_grade_does(tmp_path, capsys):
    pytest.importorskip("nbgrader", reason="nbgrader is in the dev extra: pip install -e '.[dev]'")
    from nbgrader.api import Gradebook

    course = tmp_path / "course"
    assert main(["problems", "export", str(course), "--seed", str(SEED), "--chapter", "01"]) == 0
    assert NAME in capsys.readouterr().out
    _nbgrader(course, "generate_assignment", NAME)
    release = nbformat.read(course / "release" / NAME / f"{NAME}.ipynb", as_version=4)
    text = "\n".join(c.source for c in release.cells)
    assert all(f"{draw(p.id, SEED).answer!r}" not in text for p in of_chapter("01")), "a key was released"
    for who, nb in (("alice", _answered(release, 1.0)), ("bob", _answered(release, 8.0)), ("carol", release)):
        target = course / "submitted" / who / NAME / f"{NAME}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)
    _nbgrader(course, "autograde", NAME)
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {who: [g.score for g in gradebook.find_submission_notebook(NAME, NAME, who).grades]
                  for who in ("alice", "bob", "carol")}
    count = len(of_chapter("01"))
    assert scores == {"alice": [1.0] * count, "bob": [0.0] * count, "carol": [0.0] * count}
