"""How fast is every bad input rejected, from the real entry point? (issue 30, L4: under 2 s on a quiet machine)

    python benchmarks/bad_inputs.py [--only train] [--limit 2]

Runs each bad input of tests/test_cli_bad_inputs.py (its table and the rows beyond it), plus `check` of files
and folders that cannot be graded, as `python -m partrain_edu ...` in a fresh process, and prints the seconds
each took to exit 2, the slowest first, and how many exceeded the limit. Then `train --timeout 5` of a run that
never ends: the seconds from the command's start to its return (the limit counts from the start).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_cli_bad_inputs import BAD, BEYOND  # noqa: E402


def check_cases(tmp: Path) -> list[str]:
    (tmp / "notes.txt").write_text("x")
    (tmp / "emptydir").mkdir()
    cases = [f"check {tmp / 'notes.txt'}", f"check {tmp / 'emptydir'}", f"check {tmp / 'missing'}",
             f"check {tmp} --timeout 0", f"check {tmp} --exercise nosuch"]
    for name, text in [("corrupt", "{not json"), ("list", "[]"), ("dict", '{"a": 1}'), ("empty", "")]:
        path = tmp / f"01_ring_all_reduce_{name}.ipynb"
        path.write_text(text)
        cases += [f"check {path}", f"check {path} --json"]
    return cases


def timed(args: str) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "partrain_edu", *shlex.split(args)], capture_output=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="only the commands starting with this word (train, check)")
    parser.add_argument("--limit", type=float, default=2.0)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [args for _, args, _ in BAD] + [args for args, _ in BEYOND] + check_cases(Path(tmp))
        cases = [c for c in cases if opts.only is None or c.startswith(opts.only)]
        times = sorted(((*timed(args), args) for args in cases), reverse=True)
    for seconds, code, args in times[:15]:
        print(f"{seconds:6.2f} s  exit {code}  partrain-edu {args}")
    over = [t for t in times if t[0] > opts.limit]
    print(f"{len(times)} bad inputs: slowest {times[0][0]:.2f} s, median {times[len(times) // 2][0]:.2f} s, "
          f"{len(over)} over {opts.limit:g} s; not exit 2: {sum(code != 2 for _, code, _ in times)}")
    if opts.only in (None, "train"):
        seconds, code = timed("train --strategy single --steps 1000000 --global-batch 1024 --timeout 5")
        print(f"train --timeout 5 of an endless run: returned after {seconds:.1f} s (exit {code})")


if __name__ == "__main__":
    main()
