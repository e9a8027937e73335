"""Measured on the emulated A100 vs predicted by the formulas and the simulator, in one 4-rank run.

    python benchmarks/emulated_vs_model.py [--json]

Runs the rank program of tests/test_emulated.py (tests/ranks/emulated.py: generic Linear stacks charged fixed
emulated costs) and prints each measurement beside its prediction: the GPipe, 1F1B and interleaved bubbles
at p = 4, m = 8; a 1F1B step with a 1.5× slower last stage over the balanced one; DDP's saving from
overlapping bucketed all-reduces with backward; DDP's step over 1 GbE vs InfiniBand. Times come from the
emulated clock, so they do not depend on how busy this machine is; the wall time of the run is printed too.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from partrain_edu.launcher import torchrun

RANKS = Path(__file__).resolve().parent.parent / "tests" / "ranks" / "emulated.py"


def rows(r: dict) -> list[tuple[str, float, float]]:
    ddp, links = r["ddp"], r["links"]
    return [(f"{name} bubble", r[name]["bubble"], r[name]["simulated"]) for name in ("gpipe", "1f1b", "interleaved")] + [
        ("1F1B step, last stage 1.5× slower / balanced", r["slow_last"]["makespan"] / r["1f1b"]["makespan"],
         r["slow_last"]["simulated_ratio"]),
        ("DDP overlap saving (s), 4 buckets vs 1", ddp["single"] - ddp["bucketed"],
         ddp["model_single"] - ddp["model_bucketed"]),
        ("DDP step, 1 GbE / InfiniBand", links["1gbe"] / links["infiniband"],
         links["model_1gbe"] / links["model_infiniband"])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    start = time.perf_counter()
    result = torchrun(RANKS, nproc=4, timeout=600, echo=None).published["results"]
    wall = time.perf_counter() - start
    table = [{"what": what, "measured": measured, "predicted": predicted} for what, measured, predicted in rows(result)]
    if args.json:
        print(json.dumps({"rows": table, "report": result["report"], "wall_s": wall}, indent=1))
        return
    print(f"{'':48s}{'measured':>10}{'predicted':>11}")
    for row in table:
        print(f"{row['what']:48s}{row['measured']:>10.4f}{row['predicted']:>11.4f}")
    report = result["report"]
    print(f"charged compute / real arithmetic inside it: {report['dominance']:.0f}× (≥ 10 keeps contention out); "
          f"run took {wall:.1f} s of wall time")


if __name__ == "__main__":
    main()
