"""A class set for nbgrader: the chapters' problems with one seed, as a source notebook in an nbgrader course.

    partrain-edu problems export COURSE --seed 7 --chapter 03 --chapter 04
        # COURSE/source/problems_seed7/problems_seed7.ipynb and COURSE/nbgrader_config.py
    cd COURSE && nbgrader generate_assignment problems_seed7 && nbgrader autograde problems_seed7

Per problem: the question (a locked markdown cell), an answer cell (`answer_<id> = None`, then the key between
the solution markers, which nbgrader's release replaces) and a test cell worth 1 point that calls
`partrain_edu.problems.bank.grade`, so the released notebook holds no key and the grade is the course's own,
hint included. The settings are the course's (grading/authoring/nbgrader_config.py).
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat

from partrain_edu.grading.authoring.make_exercises import BEGIN, END
from partrain_edu.grading.authoring.nbgrader_config import CONFIG_FILE
from partrain_edu.problems.bank import draw, of_chapter


def _meta(grade_id: str, *, solution: bool = False, grade: bool = False) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if grade:
        meta["points"] = 1
    return {"nbgrader": meta}


def variable(pid: str) -> str:
    """The answer's name in the notebook: answer_03_zero_fits for 03.zero-fits."""
    return "answer_" + re.sub(r"\W", "_", pid)


def notebook(seed: int, chapter_ids: list[str]) -> nbformat.NotebookNode:
    """The source notebook: every problem of `chapter_ids`, drawn with `seed`, with its key and its test."""
    cells = [nbformat.v4.new_markdown_cell(
        f"# Problems, seed {seed}\n\nAnswer each in the unit it asks for, as a plain number in place of `None`. "
        "Each is graded by the course's own functions within its tolerance; a wrong answer's message names the "
        "likely mistake.", metadata=_meta("intro"))]
    for chapter in chapter_ids:
        for p in of_chapter(chapter):
            drawn = draw(p.id, seed)
            name = variable(p.id)
            gid = name.removeprefix("answer_")
            cells.append(nbformat.v4.new_markdown_cell(
                f"**{p.id}** ({p.kind}; answer in {p.unit or 'plain numbers'}, ±{p.rtol:.0%}): {drawn.question}",
                metadata=_meta(f"question_{gid}")))
            cells.append(nbformat.v4.new_code_cell(f"{name} = None\n{BEGIN}\n{name} = {drawn.answer!r}\n{END}",
                                                   metadata=_meta(name, solution=True)))
            cells.append(nbformat.v4.new_code_cell(
                "from partrain_edu.problems.bank import grade\n\n"
                f"result = grade({p.id!r}, {seed}, {name})\nassert result['correct'], result['hint']",
                metadata=_meta(f"grade_{gid}", grade=True)))
    return nbformat.v4.new_notebook(cells=cells, metadata={
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def export(course: Path, seed: int, chapter_ids: list[str]) -> Path:
    """Write the source notebook of the class set into nbgrader course `course`; returns its path."""
    name = f"problems_seed{seed}"
    path = Path(course) / "source" / name / f"{name}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook(seed, chapter_ids), path)
    config = Path(course) / "nbgrader_config.py"
    if not config.exists():
        config.write_text(CONFIG_FILE)
    return path
