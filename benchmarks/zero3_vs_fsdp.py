"""Our ZeRO-3 (`zero3`, with and without prefetch) against PyTorch's FSDP2 (`torch-fsdp`) — same processes, same run.

    python benchmarks/zero3_vs_fsdp.py [--nproc 2 4] [--steps 20] [--json]

For each world size, one torchrun job builds `zero3`, `zero3` with prefetch and `torch-fsdp` on TinyGPT, then
alternates their training steps (so drift in machine load hits all alike) and reports the median step time of
the slowest rank and the ratio ours / FSDP2's. Also `ddp` as the unsharded baseline. Step times on a shared
CPU are noisy: read the ratio, not the seconds.
"""
from __future__ import annotations

import argparse
import json

from partrain_edu.launcher import torchrun

SCRIPT = r"""
import sys, time, statistics
import torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.benchmarking import alternate_steps
from partrain_edu.config import TrainConfig
from partrain_edu.strategies.fsdp import Zero3
from partrain_edu.strategies import get_strategy

ctx = runtime.init()
steps, warmup = int(sys.argv[1]), 3
cfg = TrainConfig(strategy="zero3", nproc=ctx.world_size, steps=steps)
contenders = {"zero3": Zero3(ctx, cfg), "zero3 prefetch": Zero3(ctx, cfg, prefetch=True),
              "torch-fsdp": get_strategy("torch-fsdp")(ctx, cfg), "ddp": get_strategy("ddp")(ctx, cfg)}

times = alternate_steps(contenders, steps, warmup, cfg.global_batch)["times"]
runtime.publish("result", {name: statistics.median(v) for name, v in times.items()})
"""


def measure(nproc: int, steps: int) -> dict:
    medians = torchrun(SCRIPT, nproc=nproc, args=[str(steps)], timeout=600, echo=None).published["result"]
    fsdp = medians["torch-fsdp"]
    return {"nproc": nproc, "step_time_s": medians,
            "ratio_zero3_over_fsdp": medians["zero3"] / fsdp,
            "ratio_zero3_prefetch_over_fsdp": medians["zero3 prefetch"] / fsdp}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(n, args.steps) for n in args.nproc]
    if args.json:
        print(json.dumps(rows))
        return
    for row in rows:
        times = "  ".join(f"{k} {v * 1e3:.1f} ms" for k, v in row["step_time_s"].items())
        print(f"{row['nproc']} ranks: {times}")
        print(f"    zero3 / torch-fsdp ratio {row['ratio_zero3_over_fsdp']:.2f}, "
              f"with prefetch ratio {row['ratio_zero3_prefetch_over_fsdp']:.2f}")


if __name__ == "__main__":
    main()
