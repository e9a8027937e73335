"""Step time of our 1F1B pipeline (`pp-1f1b`) against PyTorch's (`torch-pp`, `Schedule1F1B`), in one run.

    python benchmarks/pp_vs_torch.py [--nproc 4] [--microbatches 8] [--steps 20] [--warmup 3]

Both strategies are built in the same processes, from the same init and the same stage split, and trained on
the same batches, one step of each in turn (so drift in machine load hits both alike). A step's time is the
slowest rank's, measured after a barrier; we report each strategy's median and the ratio torch-pp / pp-1f1b
(above 1: ours is faster). The schedule (1F1B) and the messages ((B/m, T, H) fp32 each way, the tests check
the bytes) are the same, so the ratio measures the runtime around them: our executor's loop over
`theory.schedules` actions against PyTorch's stage/schedule machinery.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from partrain_edu.launcher import torchrun

SCRIPT = r"""
import sys, time
import torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.benchmarking import alternate_steps
from partrain_edu.config import TrainConfig
from partrain_edu.strategies import get_strategy

steps, warmup, m = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ctx = runtime.init()
runtime.seed_everything(0)
built = {name: get_strategy(name)(ctx, TrainConfig(strategy=name, nproc=ctx.world_size, microbatches=m))
         for name in ("pp-1f1b", "torch-pp")}
measured = alternate_steps(built, steps, warmup)
times, losses = measured["times"], measured["losses"]
runtime.publish("times", times)
runtime.publish("losses", losses)
runtime.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=4, help="pipeline stages (2 or 4 for TinyGPT's 4 layers)")
    parser.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (divides 16)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each strategy")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args()
    result = torchrun(SCRIPT, nproc=args.nproc, args=(str(args.steps), str(args.warmup), str(args.microbatches)),
                      echo=None)
    times, losses = result.published["times"], result.published["losses"]
    report = {"nproc": args.nproc, "microbatches": args.microbatches, "steps": args.steps,
              "pp_1f1b_median_s": statistics.median(times["pp-1f1b"]),
              "torch_pp_median_s": statistics.median(times["torch-pp"]),
              "same_losses": max(abs(a - b) for a, b in zip(losses["pp-1f1b"], losses["torch-pp"])) < 1e-5}
    report["ratio"] = report["torch_pp_median_s"] / report["pp_1f1b_median_s"]
    print(json.dumps(report, indent=1), file=sys.stderr)
    print(f"pp-1f1b vs torch-pp, {args.nproc} stages, {args.microbatches} micro-batches, median of {args.steps} "
          f"steps: pp-1f1b {report['pp_1f1b_median_s'] * 1e3:.1f} ms, torch-pp {report['torch_pp_median_s'] * 1e3:.1f}"
          f" ms, ratio torch-pp/pp-1f1b {report['ratio']:.2f}")


if __name__ == "__main__":
    main()
