"""Execute a learner's exercise notebook headlessly and collect every check it ran: `partrain-edu check PATH`.

Every `check(...)` call appends a JSON line to the file named by $PARTRAIN_GRADING_LOG; the notebook runs
top to bottom with errors allowed (a failed check must not stop the next one). A check the notebook's source
calls but that never ran (an earlier cell crashed) counts as failed. Score = passed checks / checks.
"""
from __future__ import annotations

import csv
import json
import os
import re
import tempfile
from pathlib import Path

import nbformat

from partrain_edu.grading.core import LOG_ENV

CALL = re.compile(r"""\bcheck\(\s*["']([A-Za-z0-9_]+)["']""")


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


def expected_checks(nb) -> list[str]:
    names = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            names += [n for n in CALL.findall(cell.source) if n not in names]
    return names


def grade_notebook(path: Path, timeout: float = 600) -> dict:
    """Run `path` and return {"path", "score", "checks": [{"name", "passed", "message"}]}."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="partrain_grade_") as tmp:
        log = Path(tmp) / "checks.jsonl"
        log.touch()
        previous = os.environ.get(LOG_ENV)
        os.environ[LOG_ENV] = str(log)  # the kernel inherits it
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                           resources={"metadata": {"path": str(path.parent)}}).execute()
        finally:
            if previous is None:
                os.environ.pop(LOG_ENV, None)
            else:
                os.environ[LOG_ENV] = previous
        ran = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    results: dict[str, dict] = {}
    for record in ran:  # a check run twice: the last run counts
        results[record["name"]] = {"name": record["name"], "passed": bool(record["passed"]),
                                   "message": record["message"]}
    for name in expected_checks(nb):
        results.setdefault(name, {"name": name, "passed": False,
                                  "message": f"✗ {name} never ran: a cell before it failed or was not executed"})
    checks = list(results.values())
    score = round(sum(c["passed"] for c in checks) / len(checks), 4) if checks else 0.0
    return {"path": str(path), "score": score, "checks": checks}


def write_csv(report: dict, path: str | os.PathLike) -> None:
    """One row per check, for a gradebook: notebook, score, check, passed, first line of the message."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", "score", "check", "passed", "message"])
        for nb in report["notebooks"]:
            for c in nb["checks"] or [{"name": "", "passed": False, "message": "no checks"}]:
                writer.writerow([nb["path"], nb["score"], c["name"], int(c["passed"]),
                                 " ".join(c["message"].split())])
