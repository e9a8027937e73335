"""The `check` subcommand of `partrain-edu`: grade exercise notebooks headlessly, untrusted ones included.

    partrain-edu check exercises/01_ring_all_reduce.ipynb
    partrain-edu check submissions/ --csv grades.csv [--timeout 600] [--exercise 03_memory_zero_stage] [--json]

Each notebook is graded in a sandbox against the instructor's checks for the exercise it is named after
(grader.py); one line on stderr says which isolation this machine allowed. `--timeout` is the wall-clock limit
of one notebook, its cells and checks together, in whole seconds (a fraction is rounded up). The --csv file is
opened before any grading and gets each notebook's rows as soon as it is graded, so a bad path fails at once
and an interrupted run keeps what it graded. `--json` prints {"notebooks": [{"path", "exercise", "score",
"seconds", "checks": [{"name", "passed", "message"}], "error"?}], "isolation"} (docs/cli.md).
Exit 0 when every check passed, 1 when any failed; bad input (a single file given that is not a gradable
notebook included — in a folder such a file is one failed row) raises ValueError, which `partrain_edu/cli.py`
turns into one line and exit 2 (argparse errors exit 2 the same way).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path


def seconds(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds per notebook")
    return math.ceil(value)


class Gradebook:
    """The CSV: one row per check (notebook, score, check, passed, first line of the message), flushed as
    each notebook finishes."""

    def __init__(self, path: str):
        try:
            self._file = open(path, "w", newline="", encoding="utf-8")
        except OSError as err:
            raise ValueError(f"cannot write the gradebook {path}: {err.strerror or err} "
                             "(--csv needs a file in a folder that exists)") from None
        self._writer = csv.writer(self._file)
        self._writer.writerow(["notebook", "score", "check", "passed", "message"])
        self._file.flush()

    def add(self, nb: dict) -> None:
        for c in nb["checks"] or [{"name": "", "passed": False, "message": nb.get("error") or "no checks"}]:
            message = " ".join(c["message"].split())
            self._writer.writerow([nb["path"], nb["score"], c["name"], int(c["passed"]), message])
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _print_notebook(nb: dict) -> None:
    passed = sum(c["passed"] for c in nb["checks"])
    print(f"{nb['path']}: score {nb['score']:.2f} ({passed}/{len(nb['checks'])} checks passed)"
          + (f" — {nb['error']}" if nb.get("error") else ""))
    for c in nb["checks"]:
        first = c["message"].splitlines()[0] if c["message"] else ""
        print(f"  {'PASS' if c['passed'] else 'FAIL'} {c['name']}: {first}")
        if not c["passed"]:
            print("\n".join("       " + line for line in c["message"].splitlines()[1:4]))
    sys.stdout.flush()


def _gradable(path: Path, exercise: str | None) -> None:
    """One file given: what makes it ungradable is bad input (exit 2, one line), not a row scored 0."""
    from partrain_edu.grading.authoring.manifest import EXERCISES
    from partrain_edu.grading.headless.submissions import NotANotebook, code_cells, exercise_of

    try:
        code_cells(path)
    except NotANotebook as err:
        reason = str(err).removeprefix("not a notebook: ")
        raise ValueError(f"{path} is not a notebook that can be graded: {reason}") from None
    if exercise is None and exercise_of(path) is None:
        raise ValueError(f"cannot tell which exercise {path} is: name the file after one of "
                         f"{', '.join(EXERCISES)} (or pass --exercise)")


def run_check_command(args: argparse.Namespace) -> int:
    from partrain_edu.grading.authoring.manifest import EXERCISES
    from partrain_edu.grading.headless.submissions import exercise_of, notebooks_in

    paths = notebooks_in(args.path)   # every argument is checked before the grader (torch) is imported
    if args.exercise is not None and args.exercise not in EXERCISES:
        raise ValueError(f"unknown exercise {args.exercise!r}: pick one of {', '.join(EXERCISES)}")
    if not Path(args.path).is_dir():
        _gradable(paths[0], args.exercise)
    gradebook = Gradebook(args.csv) if args.csv else None
    from partrain_edu.grading.headless.grader import grade_notebook
    from partrain_edu.grading.headless.sandbox import isolation_for

    notebooks = []
    try:
        folder = Path(args.path) if Path(args.path).is_dir() else Path(args.path).parent
        isolation = isolation_for(folder, paths[0])
        print(f"isolation: {isolation.summary}", file=sys.stderr)
        for path in paths:
            if not args.json:
                print(f"grading {path} ...", file=sys.stderr)
            nb = grade_notebook(path, args.exercise or exercise_of(path), isolation, args.timeout, args.seed)
            notebooks.append(nb)
            if gradebook:
                gradebook.add(nb)
            if not args.json:
                _print_notebook(nb)
    finally:
        if gradebook:
            gradebook.close()
    if args.json:
        print(json.dumps({"notebooks": notebooks, "isolation": isolation.summary}))
    all_passed = all(nb["checks"] and all(c["passed"] for c in nb["checks"]) for nb in notebooks)
    return 0 if all_passed else 1


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("check", help="grade exercise notebooks headlessly (in a sandbox when root)")
    p.add_argument("path", help="a notebook, or a folder of notebooks (submissions)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--csv", default=None, help="also write one row per check to this CSV file (gradebook)")
    p.add_argument("--timeout", type=seconds, default=600,
                   help="wall-clock seconds one notebook may take, cells and checks together (default 600)")
    p.add_argument("--exercise", default=None,
                   help="grade every notebook as this exercise (default: the exercise each file is named after)")
    p.add_argument("--seed", type=int, default=None,
                   help="draw every check's configurations from this seed (default: a fresh one per check, so no "
                   "answer table copied from earlier runs fits; each check's report names its seed)")
    p.set_defaults(func=run_check_command)
