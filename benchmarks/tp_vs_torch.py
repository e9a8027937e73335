"""Step time of our tensor parallelism (`tp`) against PyTorch's DTensor version (`torch-tp`), in one run.

    python benchmarks/tp_vs_torch.py [--nproc 2] [--steps 20] [--warmup 3]

Both strategies are built in the same processes, from the same init, and trained on the same batches, one step
of each in turn (so drift in machine load hits both alike). A step's time is the slowest rank's, measured after
a barrier; we report each strategy's median and the ratio torch-tp / tp (above 1: ours is faster). The
communication is the same (the tests check it call for call), so the ratio measures the framework around it:
DTensor's layout bookkeeping and functional collectives against our two autograd functions. torch-tp's
collective counter (CommDebugMode) is switched off here: it would time the counter, not DTensor.
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

steps, warmup = int(sys.argv[1]), int(sys.argv[2])
ctx = runtime.init()
runtime.seed_everything(0)
built = {}
for name in ("tp", "torch-tp"):
    cfg = TrainConfig(strategy=name, nproc=ctx.world_size, tp=ctx.world_size, steps=steps)
    built[name] = get_strategy(name)(ctx, cfg)
built["torch-tp"].count_collectives = False
measured = alternate_steps(built, steps, warmup)
times, losses = measured["times"], measured["losses"]
runtime.publish("times", times)
runtime.publish("losses", losses)
runtime.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2, help="tensor-parallel ranks (2 or 4 for TinyGPT)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each strategy")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args()
    result = torchrun(SCRIPT, nproc=args.nproc, args=(str(args.steps), str(args.warmup)), echo=None)
    times, losses = result.published["times"], result.published["losses"]
    report = {"nproc": args.nproc, "steps": args.steps,
              "tp_median_s": statistics.median(times["tp"]),
              "torch_tp_median_s": statistics.median(times["torch-tp"]),
              "same_losses": max(abs(a - b) for a, b in zip(losses["tp"], losses["torch-tp"])) < 1e-5}
    report["ratio"] = report["torch_tp_median_s"] / report["tp_median_s"]
    print(json.dumps(report, indent=1), file=sys.stderr)
    print(f"tp vs torch-tp, {args.nproc} ranks, median of {args.steps} steps: tp {report['tp_median_s'] * 1e3:.1f} ms, "
          f"torch-tp {report['torch_tp_median_s'] * 1e3:.1f} ms, ratio torch-tp/tp {report['ratio']:.2f}")


if __name__ == "__main__":
    main()
