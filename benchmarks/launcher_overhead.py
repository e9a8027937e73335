"""How much does the `%%torchrun` launcher cost on top of a bare torchrun?

    python benchmarks/launcher_overhead.py [--nproc 2] [--repeats 5]

Runs the same script both ways in one run, alternating (so drift in machine load hits both alike), and reports
medians and their ratio. Ours adds: the per-rank wrapper (`[rank k]` prefixes, error files), reading and
routing every output line, and unpickling published values. The goal is a ratio ≤ 1.05.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from partrain_edu.notebook.magics import run_cell_magic

SCRIPT = """
import torch, torch.distributed as dist
from partrain_edu import runtime
ctx = runtime.init()
x = torch.ones(1 << 16)
for _ in range(20):
    dist.all_reduce(x)
print(f"rank {ctx.rank}: {x[0].item():.0f}")
runtime.publish("value", x[0].item())
runtime.shutdown()
"""


def time_bare(path: str, nproc: int) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                    path], check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def time_magic(nproc: int) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):  # the lines are still routed and kept, just not shown
        run_cell_magic(f"-n {nproc}", SCRIPT, {})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "script.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        time_bare(path, args.nproc)  # warm the file cache once, untimed
        bare, ours = [], []
        for _ in range(args.repeats):
            bare.append(time_bare(path, args.nproc))
            ours.append(time_magic(args.nproc))
    result = {"nproc": args.nproc, "repeats": args.repeats, "bare_torchrun_median_s": statistics.median(bare),
              "torchrun_magic_median_s": statistics.median(ours)}
    result["ratio"] = result["torchrun_magic_median_s"] / result["bare_torchrun_median_s"]
    print(json.dumps(result, indent=1), file=sys.stderr)
    print(f"%%torchrun vs bare torchrun, {args.nproc} ranks, median of {args.repeats}: "
          f"{result['torchrun_magic_median_s']:.2f} s vs {result['bare_torchrun_median_s']:.2f} s, "
          f"ratio {result['ratio']:.3f}")


if __name__ == "__main__":
    main()
