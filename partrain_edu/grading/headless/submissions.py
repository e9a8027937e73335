"""Reading what the grader is given: which notebooks, which exercise each one is, and its code cells — with
a one-line reason for anything that is not a notebook (bad JSON, `{"a": 1}`, `[]`, `"cells": "oops"`, an
empty file), so that one bad file is one failed row, never the end of a folder's grading.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from partrain_edu.grading.authoring.manifest import EXERCISES

MAX_NOTEBOOK_BYTES = 32 * 2**20


class NotANotebook(ValueError):
    """The file cannot be graded as a notebook; the message says why, in one line."""


def notebooks_in(path: str | os.PathLike) -> list[Path]:
    path = Path(path)
    if path.is_file():
        if path.suffix != ".ipynb":
            raise ValueError(f"{path} is not a notebook: pass a .ipynb file or a folder of them")
        return [path]
    if not path.is_dir():
        raise ValueError(f"no such file or folder: {path}")
    found = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    if not found:
        raise ValueError(f"no .ipynb notebooks under {path}")
    return found


def exercise_of(path: Path) -> str | None:
    """The exercise whose name the file (or else a folder above it) contains: `03_memory_zero_stage.ipynb`,
    `alice-03_memory_zero_stage.ipynb`, `03_memory_zero_stage/alice.ipynb`; None when none or several do."""
    for name in (path.stem, *(p.name for p in path.parents)):
        hits = [exercise for exercise in EXERCISES if exercise in name]
        if len(hits) == 1:
            return hits[0]
    return None


def code_cells(path: Path) -> list[tuple[int, str]]:
    """(number, source) of every code cell, in order (nbformat 4); numbers count every cell from 1, as a
    reader of the notebook would."""
    try:
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            raise NotANotebook(f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB")
        nb = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as err:
        raise NotANotebook(f"not a notebook: not JSON ({str(err)[:100]})") from None
    except OSError as err:
        raise NotANotebook(f"cannot read it: {err.strerror or err}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotANotebook("not a notebook: JSON without a list of cells (open it in Jupyter and save it)")
    if nb.get("nbformat") != 4:
        raise NotANotebook(f"nbformat {nb.get('nbformat')!r} notebook: save it as nbformat 4 (Jupyter does)")
    sources = []
    for i, cell in enumerate(nb["cells"]):
        if not isinstance(cell, dict) or not isinstance(cell.get("cell_type"), str):
            raise NotANotebook(f"not a notebook: cell {i + 1} is not a cell")
        if cell["cell_type"] != "code":
            continue
        source = cell.get("source", "")
        if isinstance(source, list) and all(isinstance(line, str) for line in source):
            source = "".join(source)
        if not isinstance(source, str):
            raise NotANotebook(f"not a notebook: cell {i + 1}'s source is not text")
        sources.append((i + 1, source))
    return sources
