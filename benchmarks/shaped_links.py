"""All-reduce on real shaped links: measured times over sizes at a few `tc` rates, Hockney's α and β fitted to
them against the configured rate, then one DDP step over 1 Gbit/s against an unshaped veth.

    sudo .venv/bin/python benchmarks/shaped_links.py [--rates 100mbit 300mbit 1gbit] [--repeats 3] [--no-ddp] [--json]

Two emulated nodes (`partrain_edu.netem.TwoNodes`, needs root), one rank each, so every byte crosses the shaped
veth. Each size's time is the median of `--repeats` (the slowest rank's); `theory.traffic.fit_alpha_beta` fits
t = 2α + S/β (a 2-rank ring all-reduce: 2 messages, each rank sends S in all). Expect a fitted β a few % under
the rate (tbf counts whole Ethernet frames; TCP's payload is 1448 of every 1514 bytes) and an α of this machine's
TCP + Gloo cost, not the wire's. The DDP part trains a 4-layer, 256-wide TinyGPT (12.7 MB of fp32 gradients, one
25 MiB bucket) and compares its step time with the unshaped step plus the gradients' all-reduce at the rate.
"""
from __future__ import annotations

import argparse
import json

from partrain_edu import netem
from partrain_edu.netem.nodes import unavailable_message
from partrain_edu.theory.traffic import collective_time, fit_alpha_beta

SIZES = (4 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)

ALL_REDUCE = r"""
import statistics, sys, time, torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.benchmarking import slowest
ctx = runtime.init()
repeats, sizes = int(sys.argv[1]), [int(s) for s in sys.argv[2:]]
samples = []
for size in sizes:
    t = torch.ones(size // 4)
    times = []
    for _ in range(1 + (repeats if size >= 1 << 20 else 10 * repeats)):  # the first is a warm-up; small ones are noisy
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        times.append(slowest(time.perf_counter() - start))
    samples.append(["all_reduce", size, ctx.world_size, statistics.median(times[1:])])
runtime.publish("samples", samples)
"""

DDP_STEP = r"""
import statistics, time, torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.benchmarking import slowest
from partrain_edu.data import SyntheticTokens, data_parallel_slice
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.parallel.ddp import DistributedDataParallel
ctx = runtime.init()
cfg = GPTConfig(n_layer=4, n_embd=256, n_head=4)
model = DistributedDataParallel(TinyGPT(cfg))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = SyntheticTokens(vocab_size=cfg.vocab_size, seq_len=cfg.seq_len)
times = []
for step in range(10):
    x, y = data_parallel_slice(*data.global_batch(step, 16), ctx.rank, ctx.world_size)
    dist.barrier()
    start = time.perf_counter()
    optimizer.zero_grad(set_to_none=True)
    TinyGPT.loss(model(x), y).backward()
    optimizer.step()
    times.append(slowest(time.perf_counter() - start))
runtime.publish("ddp", {"step_s": statistics.median(times[2:]), "buckets": len(model.buckets),
                        "grad_bytes": sum(p.numel() * 4 for p in model.parameters())})
"""


def all_reduce_rows(rates: list[str | None], repeats: int) -> list[dict]:
    rows = []
    for rate in rates:
        with netem.TwoNodes(rate=rate) as nodes:
            result = nodes.run(ALL_REDUCE, args=[str(repeats), *map(str, SIZES)], timeout=300, echo=None)
            configured = nodes.bytes_per_s
        samples = [tuple(s) for s in result.published["samples"]]
        alpha, beta, error = fit_alpha_beta(samples)
        rows.append({"rate": rate or "unshaped", "configured_bytes_per_s": configured, "alpha_s": alpha,
                     "beta_bytes_per_s": beta, "fit_rms_relative_error": error,
                     "samples": [{"bytes": size, "seconds": t} for _, size, _, t in samples]})
    return rows


def ddp_rows() -> list[dict]:
    rows = []
    for rate in (None, "1gbit"):
        with netem.TwoNodes(rate=rate) as nodes:
            rows.append({"rate": rate or "unshaped", "configured_bytes_per_s": nodes.bytes_per_s,
                         **nodes.run(DDP_STEP, timeout=300, echo=None).published["ddp"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", nargs="+", default=["100mbit", "300mbit", "1gbit"],
                        help="tc rates, e.g. 200mbit or 1gbit (an unshaped veth is always measured too)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-ddp", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ok, why = netem.available()
    if not ok:
        parser.error(unavailable_message(why))
    report = {"all_reduce": all_reduce_rows([None, *args.rates], args.repeats)}
    if not args.no_ddp:
        report["ddp"] = ddp_rows()
    if args.json:
        print(json.dumps(report, indent=1))
        return
    print("2-rank all_reduce across two namespaces (median of the slowest rank), and the α–β fit")
    print(f"  {'link':>9} {'configured β':>13} {'fitted β':>10} {'fit/conf':>9} {'fitted α':>10} {'fit error':>10}")
    for row in report["all_reduce"]:
        configured = row["configured_bytes_per_s"]
        ratio = f"{row['beta_bytes_per_s'] / configured:9.2f}" if configured else f"{'-':>9}"
        conf = f"{configured / 1e6:8.1f} MB/s" if configured else f"{'-':>13}"
        print(f"  {row['rate']:>9} {conf} {row['beta_bytes_per_s'] / 1e6:5.1f} MB/s {ratio} "
              f"{row['alpha_s'] * 1e6:7.0f} µs {row['fit_rms_relative_error']:10.0%}")
    print("per size, measured vs the model 2α + S/β: fitted α, configured β (unshaped: fitted β)")
    print(f"  {'size':>9} " + " ".join(f"{row['rate']:>18}" for row in report["all_reduce"]))
    print(f"  {'':>9} " + " ".join(f"{'measured / model':>18}" for _ in report["all_reduce"]))
    for i, size in enumerate(SIZES):
        cells = []
        for row in report["all_reduce"]:
            measured = row["samples"][i]["seconds"]
            beta = row["configured_bytes_per_s"] or row["beta_bytes_per_s"]  # model: fitted α, configured β
            model = collective_time("all_reduce", size, 2, alpha=row["alpha_s"], beta=beta)
            cells.append(f"{measured * 1e3:8.2f} / {model * 1e3:7.2f}")
        print(f"  {size >> 10:>6} KiB " + " ".join(f"{c:>18}" for c in cells) + "  ms")
    if "ddp" in report:
        free, shaped = report["ddp"]
        comm = collective_time("all_reduce", shaped["grad_bytes"], 2, alpha=0.0, beta=shaped["configured_bytes_per_s"])
        print(f"DDP step, TinyGPT 4×256 ({shaped['grad_bytes'] / 1e6:.1f} MB of gradients, {shaped['buckets']} "
              f"DDP bucket(s)), 1 rank per node: unshaped {free['step_s'] * 1e3:.0f} ms, 1 Gbit/s "
              f"{shaped['step_s'] * 1e3:.0f} ms; unshaped + gradients/β = {(free['step_s'] + comm) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
