"""The graded functions of a solution notebook, as the grader sees them: `Source`s read from solutions/, so a
test grades the instructor's answer (and variants of it) without a kernel."""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat

from partrain_edu.grading.learner_code import Source

ROOT = Path(__file__).resolve().parents[1]


def solution_source(notebook: str, function: str) -> Source:
    """The source of top-level function `function` in solutions/`notebook`.ipynb (markers left in: comments)."""
    nb = nbformat.read(ROOT / "solutions" / f"{notebook}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == function:
                return Source(function, ast.get_source_segment(cell.source, node))
    raise LookupError(f"solutions/{notebook}.ipynb defines no function {function!r}")


def variant(source: Source, old: str, new: str) -> Source:
    """`source` with `old` (which must occur) replaced by `new`: a deliberately wrong answer."""
    assert old in source.text, f"{old!r} is not in {source.name}'s source"
    return Source(source.name, source.text.replace(old, new))
