"""Our DDP against PyTorch's, and our ring all-reduce against `dist.all_reduce` — same processes, same run.

    python benchmarks/ddp_vs_torch.py [--nproc 2 4] [--steps 20] [--json]

For each world size, one torchrun job builds both `ddp` (partrain_edu.strategies.ddp) and `torch-ddp`
(DistributedDataParallel with the traced hook, as `partrain-edu train` runs it) on TinyGPT, then alternates
their training steps (so drift in machine load hits both alike) and reports the median step time of the
slowest rank and the ratio ours / torch's (goal ≤ 1.10). Both use 25 MiB buckets: one bucket for TinyGPT.
A second pair runs both with 256 KiB buckets (4 buckets, overlapping backward). Then it times `ring_all_reduce` (isend/irecv, in
Python) against `dist.all_reduce` (Gloo's C++ algorithm) on a few sizes, with the bus bandwidth
S/t · 2(n−1)/n (nccl-tests' definition) of each.
"""
from __future__ import annotations

import argparse
import json
import statistics

from partrain_edu.launcher import torchrun
from partrain_edu.units import format_bytes

SCRIPT = r"""
import sys, time, statistics
import torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.benchmarking import alternate_steps, slowest
from torch.nn.parallel import DistributedDataParallel
from partrain_edu.comm.adapters import traced_allreduce_hook
from partrain_edu.config import TrainConfig
from partrain_edu.parallel.ring import ring_all_reduce
from partrain_edu.strategies import get_strategy
from partrain_edu.strategies.ddp import DDP

ctx = runtime.init()
steps, warmup = int(sys.argv[1]), 3
cfg = TrainConfig(strategy="ddp", nproc=ctx.world_size, steps=steps)
runtime.seed_everything(0)
contenders = {"ddp": DDP(ctx, cfg), "torch-ddp": get_strategy("torch-ddp")(ctx, cfg),
              "ddp 256k": DDP(ctx, cfg, bucket_cap_bytes=256 * 1024),
              "torch-ddp 256k": get_strategy("torch-ddp")(ctx, cfg)}
small = contenders["torch-ddp 256k"]                 # the same strategy, with torch's buckets at 256 KiB
small.model = DistributedDataParallel(small.new_model(), bucket_cap_mb=0.25)
small.model.register_comm_hook(state=None, hook=traced_allreduce_hook)
small.optimizer = small.new_optimizer(small.model.parameters())

times = alternate_steps(contenders, steps, warmup, cfg.global_batch)["times"]

collectives = {}
for numel in (16 * 1024, 256 * 1024, 4 * 1024 * 1024):
    t = torch.ones(numel)
    rows = {"ring_all_reduce": [], "dist.all_reduce": []}
    for repeat in range(2 + 10):
        for name, fn in (("ring_all_reduce", ring_all_reduce), ("dist.all_reduce", dist.all_reduce)):
            dist.barrier()
            start = time.perf_counter()
            fn(t)
            elapsed = slowest(time.perf_counter() - start)
            if repeat >= 2:
                rows[name].append(elapsed)
    collectives[numel * 4] = {name: statistics.median(v) for name, v in rows.items()}
runtime.publish("result", {"steps": {k: statistics.median(v) for k, v in times.items()},
                           "collectives": collectives})
"""


def measure(nproc: int, steps: int) -> dict:
    result = torchrun(SCRIPT, nproc=nproc, args=[str(steps)], timeout=600, echo=None).published["result"]
    ours, theirs = result["steps"]["ddp"], result["steps"]["torch-ddp"]
    rows = []
    for nbytes, t in result["collectives"].items():
        factor = 2 * (nproc - 1) / nproc
        rows.append({"bytes": nbytes, "ring_s": t["ring_all_reduce"], "torch_s": t["dist.all_reduce"],
                     "ratio": t["ring_all_reduce"] / t["dist.all_reduce"],
                     "ring_busbw": nbytes / t["ring_all_reduce"] * factor,
                     "torch_busbw": nbytes / t["dist.all_reduce"] * factor})
    small = result["steps"]["ddp 256k"], result["steps"]["torch-ddp 256k"]
    return {"nproc": nproc, "ddp_step_s": ours, "torch_ddp_step_s": theirs, "ratio": ours / theirs,
            "ddp_256k_step_s": small[0], "torch_ddp_256k_step_s": small[1], "ratio_256k": small[0] / small[1],
            "all_reduce": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = [measure(n, args.steps) for n in args.nproc]
    if args.json:
        print(json.dumps(results))
        return
    for r in results:
        print(f"{r['nproc']} ranks: ddp {r['ddp_step_s'] * 1e3:.1f} ms, torch-ddp {r['torch_ddp_step_s'] * 1e3:.1f} ms "
              f"per step median → ratio {r['ratio']:.2f} (goal ≤ 1.10)")
        print(f"    256 KiB buckets: ddp {r['ddp_256k_step_s'] * 1e3:.1f} ms, torch-ddp "
              f"{r['torch_ddp_256k_step_s'] * 1e3:.1f} ms → ratio {r['ratio_256k']:.2f}")
        for row in r["all_reduce"]:
            print(f"    all-reduce {format_bytes(row['bytes']):>9}: ring {row['ring_s'] * 1e3:7.2f} ms, "
                  f"dist {row['torch_s'] * 1e3:7.2f} ms → ratio {row['ratio']:.2f}; bus bandwidth "
                  f"{row['ring_busbw'] / 1e9:.2f} vs {row['torch_busbw'] / 1e9:.2f} GB/s")
    print(f"median ratio ddp / torch-ddp: {statistics.median(r['ratio'] for r in results):.2f}")


if __name__ == "__main__":
    main()
