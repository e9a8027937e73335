"""How much faster is a cell on warm ranks (`%%dist`) than on fresh ones (`%%torchrun`)?

    python benchmarks/warm_vs_oneshot.py [--nproc 2 4] [--repeats 5] [--cells 20]

For each world size, in one run: a one-shot `launcher.torchrun` of a trivial all-reduce script (start torchrun,
import torch, rendezvous, one all-reduce, tear down), and the same all-reduce as a cell on a `launcher.Pool` started
once — as the bare cell, and as the whole script again (a `%%torchrun` cell pasted into `%%dist`, whose
`runtime.init()` rebuilds the process group). One-shot launches and warm cells alternate, so drift in the machine's
load hits both alike. Prints medians and the ratio one-shot / warm; the goal is a warm median ≤ 0.3 s and ≥ 10×.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from partrain_edu.launcher import torchrun
from partrain_edu.launcher.warm.pool import Pool

CELL = "t = torch.ones(1)\ndist.all_reduce(t)\nassert t.item() == world_size\n"
SCRIPT = "import torch\nimport torch.distributed as dist\nfrom partrain_edu import runtime\nctx = runtime.init()\n" \
         "rank, world_size = ctx.rank, ctx.world_size\n" + CELL


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(nproc: int, repeats: int, cells: int) -> dict:
    start = time.perf_counter()
    pool = Pool(nproc, echo=None)
    startup = time.perf_counter() - start
    oneshot, warm, warm_script = [], [], []
    try:
        pool.run(CELL)  # untimed: the first collective of a group sets up Gloo's pairs
        for _ in range(repeats):
            oneshot.append(seconds(lambda: torchrun(SCRIPT, nproc=nproc, echo=None)))
            warm += [seconds(lambda: pool.run(CELL)) for _ in range(cells)]
            warm_script.append(seconds(lambda: pool.run(SCRIPT)))
    finally:
        pool.stop()
    result = {"nproc": nproc, "pool_start_s": startup, "oneshot_median_s": statistics.median(oneshot),
              "warm_cell_median_s": statistics.median(warm), "warm_script_median_s": statistics.median(warm_script)}
    result["ratio_cell"] = result["oneshot_median_s"] / result["warm_cell_median_s"]
    result["ratio_script"] = result["oneshot_median_s"] / result["warm_script_median_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cells", type=int, default=20, help="warm cells timed per one-shot launch")
    args = parser.parse_args()
    for nproc in args.nproc:
        r = measure(nproc, args.repeats, args.cells)
        print(json.dumps(r, indent=1), file=sys.stderr)
        print(f"{nproc} ranks: one-shot {r['oneshot_median_s']:.2f} s (median of {args.repeats}); warm cell "
              f"{r['warm_cell_median_s'] * 1000:.1f} ms (median of {args.repeats * args.cells}), "
              f"{r['ratio_cell']:.0f}x faster; the whole script as a warm cell {r['warm_script_median_s'] * 1000:.0f} ms, "
              f"{r['ratio_script']:.0f}x; starting the pool once took {r['pool_start_s']:.2f} s", flush=True)


if __name__ == "__main__":
    main()
