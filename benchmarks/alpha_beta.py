"""Fit Hockney's α and β for Gloo on this machine, then predict per-parameter vs bucketed DDP with them.

    python benchmarks/alpha_beta.py [--nproc 2 4] [--repeats 15] [--json]

One torchrun job per world size times `dist.all_reduce` (median of `--repeats`, the slowest rank's) on sizes
from 64 B to 4 MiB; `theory.traffic.fit_alpha_beta` fits t = 2(n−1)·α + 2(n−1)/n·S/β per world size and prints α, β and the fit's
relative RMS error. Then, with the 2-rank fit, it predicts how long all-reducing TinyGPT's gradients takes one
tensor at a time (notebook 02's per-parameter synchronisation: one message each) and in one bucket (DDP's),
and measures both. These are this machine's loopback numbers (TCP through
the kernel, ranks sharing 2 cores): α here is tens of µs, not NVLink's few µs — the point is the shape,
t = α·messages + bytes/β, and that many small messages pay α many times.
"""
from __future__ import annotations

import argparse
import json
import os

from partrain_edu.launcher import torchrun
from partrain_edu.theory.traffic import collective_time, fit_alpha_beta

SCRIPT = r"""
import sys, time, statistics
import torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.benchmarking import slowest
from partrain_edu.models import GPTConfig, TinyGPT

ctx = runtime.init()
repeats = int(sys.argv[1])

def timed(fn):
    times = []
    for _ in range(repeats + 2):
        dist.barrier()
        start = time.perf_counter()
        fn()
        times.append(slowest(time.perf_counter() - start))
    return statistics.median(times[2:])

samples = []
for size in (64, 1024, 16 * 1024, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024):
    t = torch.ones(size // 4)
    samples.append(["all_reduce", size, ctx.world_size, timed(lambda: dist.all_reduce(t))])
ddp = None
if ctx.world_size == 2:
    model = TinyGPT(GPTConfig())
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    ddp = {"sizes": [g.numel() * 4 for g in grads],
           "per_parameter": timed(lambda: [dist.all_reduce(g) for g in grads]),
           "bucketed": timed(lambda: dist.all_reduce(flat))}
runtime.publish("result", {"samples": samples, "ddp": ddp})
runtime.shutdown()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fits, samples, ddp = {}, [], None
    for n in args.nproc:
        result = torchrun(SCRIPT, nproc=n, args=[str(args.repeats)], timeout=600, echo=None).published["result"]
        mine = [tuple(s) for s in result["samples"]]
        alpha, beta, error = fit_alpha_beta(mine)
        fits[n] = {"alpha_s": alpha, "beta_bytes_per_s": beta, "fit_rms_relative_error": error}
        samples += mine
        ddp = result["ddp"] or ddp
    alpha, beta = fits[min(fits)]["alpha_s"], fits[min(fits)]["beta_bytes_per_s"]
    report = {"fits": fits, "samples": [{"op": op, "bytes": size, "ranks": n, "seconds": t}
                                        for op, size, n, t in samples]}
    if ddp is not None:
        one = [collective_time("all_reduce", s, 2, alpha=alpha, beta=beta) for s in ddp["sizes"]]
        report["ddp_2_ranks"] = {
            "tensors": len(ddp["sizes"]), "bytes": sum(ddp["sizes"]),
            "per_parameter": {"predicted_s": sum(one), "measured_s": ddp["per_parameter"]},
            "bucketed": {"predicted_s": collective_time("all_reduce", sum(ddp["sizes"]), 2, alpha=alpha, beta=beta),
                         "measured_s": ddp["bucketed"]}}
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for n, fit in fits.items():
        print(f"Gloo, {n} ranks on this machine: α = {fit['alpha_s'] * 1e6:.0f} µs per message, "
              f"β = {fit['beta_bytes_per_s'] / 1e9:.2f} GB/s (relative RMS error of the fit {fit['fit_rms_relative_error']:.0%})")
        for s in (s for s in report["samples"] if s["ranks"] == n):
            predicted = collective_time("all_reduce", s["bytes"], n, alpha=fit["alpha_s"], beta=fit["beta_bytes_per_s"])
            print(f"  {s['bytes']:>9} B: measured {s['seconds'] * 1e3:8.3f} ms, fit {predicted * 1e3:8.3f} ms")
    if len(fits) > 1 and os.cpu_count() < max(fits):
        print(f"(more ranks than the machine's {os.cpu_count()} cores: their α includes waiting for a core)")
    if ddp is not None:
        d = report["ddp_2_ranks"]
        print(f"TinyGPT's gradients on 2 ranks ({d['tensors']} tensors, {d['bytes']} B):")
        for name in ("per_parameter", "bucketed"):
            print(f"  {name:13s} predicted {d[name]['predicted_s'] * 1e3:7.2f} ms, "
                  f"measured {d[name]['measured_s'] * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
