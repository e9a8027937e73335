"""The `check` subcommand of `partrain-edu`: grade exercise notebooks headlessly.

    partrain-edu check exercises/01_ring_all_reduce.ipynb
    partrain-edu check submissions/ --json --csv grades.csv

`--json` prints {"notebooks": [{"path", "score", "checks": [{"name", "passed", "message"}]}]} (DESIGN.md).
Exit 0 when every check passed, 1 when any failed; a missing path or a non-notebook raises ValueError, which
`partrain_edu/cli.py` turns into exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys


def run_check_command(args: argparse.Namespace) -> int:
    from partrain_edu.grading.notebook import grade_notebook, notebooks_in, write_csv

    paths = notebooks_in(args.path)
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be a positive number of seconds per cell, got {args.timeout:g}")
    notebooks = []
    for path in paths:
        if not args.json:
            print(f"grading {path} ...", file=sys.stderr)
        notebooks.append(grade_notebook(path, timeout=args.timeout))
    report = {"notebooks": notebooks}
    if args.csv:
        write_csv(report, args.csv)
    if args.json:
        print(json.dumps(report))
    else:
        for nb in notebooks:
            passed = sum(c["passed"] for c in nb["checks"])
            print(f"{nb['path']}: score {nb['score']:.2f} ({passed}/{len(nb['checks'])} checks passed)")
            for c in nb["checks"]:
                first = c["message"].splitlines()[0] if c["message"] else ""
                print(f"  {'PASS' if c['passed'] else 'FAIL'} {c['name']}: {first}")
                if not c["passed"]:
                    print("\n".join("       " + line for line in c["message"].splitlines()[1:4]))
    all_passed = all(c["passed"] for nb in notebooks for c in nb["checks"]) and all(nb["checks"] for nb in notebooks)
    return 0 if all_passed else 1


def add_subcommands(subparsers) -> None:
    p = subparsers.add_parser("check", help="run exercise notebooks headlessly and grade their checks")
    p.add_argument("path", help="a notebook, or a folder of notebooks (submissions)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--csv", default=None, help="also write one row per check to this CSV file (gradebook)")
    p.add_argument("--timeout", type=float, default=600, help="seconds one cell may run (default 600)")
    p.set_defaults(func=run_check_command)
