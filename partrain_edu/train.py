"""The one training loop every strategy shares, and how `partrain-edu train` launches it on N ranks.

    partrain-edu train --strategy single --steps 20 --json
    partrain-edu train --strategy torch-ddp --nproc 2 --steps 20 --json
    torchrun --nproc-per-node 2 -m partrain_edu.train --strategy ddp --steps 20     (the ranks' side)
    launch(TrainConfig("ddp", nproc=4)); launch_all([TrainConfig("ddp", nproc=4), TrainConfig("zero3", nproc=4)])

The strategies (`partrain_edu.strategies`) build the model and take a step; this loop feeds every one the
same global batches and measures, for the JSON report (the CLI contract):
- losses: the global-batch mean loss of each step (reported with the tracer paused: it is not training traffic);
- comm: per step, the collectives of the rank that sends most, bytes under the ring cost model (`CommTracer`);
- state_bytes: parameters, gradients and optimizer states resident on the most-loaded rank, read from tensors;
- step_time_s: the median over steps of the slowest rank's step time;
- emulated (with `--device emulated:a100`): step_time_s is then the emulated device's, read from its clock
  (`partrain_edu.emulated`); this machine's wall time, what was charged, and for pp-* the measured bubble
  beside the formula's are reported here.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.config import TrainConfig, add_train_arguments, config_from_args, to_argv
from partrain_edu.data import SyntheticTokens
from partrain_edu.progress import StepProgress
from partrain_edu.strategies import Strategy, get_strategy, tensor_bytes
from partrain_edu.strategies.emulation import check as check_emulation
from partrain_edu.strategies.emulation import emulate, mfu


def run(ctx: runtime.ParallelContext, cfg: TrainConfig, on_step: Callable[[int, float], None] | None = None,
        strategy: Strategy | None = None) -> dict:
    """Train `cfg.steps` steps on this rank; every rank returns the same report. The strategy is built from
    `cfg.strategy` unless an already-built one is given (tests and notebooks that vary its options)."""
    kind = type(strategy) if strategy is not None else get_strategy(cfg.strategy)
    if ctx.world_size != (1 if kind.in_process else cfg.nproc):
        raise ValueError(f"--nproc {cfg.nproc} does not match the {ctx.world_size} ranks torchrun started")
    strategy = strategy if strategy is not None else kind(ctx, cfg)
    em = ctx.emulator
    if em is not None:
        emulate(strategy)  # TinyGPT's blocks charged as GPT-3 XL's layers on the emulated device
    clock, per_second = (em.now, em.scale) if em is not None else (time.perf_counter, 1.0)
    data = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=cfg.seed)
    losses = []
    times = []
    walls = []
    tracer = CommTracer()
    with tracer:
        for step in range(cfg.steps):
            x, y = data.global_batch(step, cfg.global_batch)
            start, wall = clock(), time.perf_counter()
            loss_sum, count = strategy.train_step(x, y)
            elapsed = (clock() - start) / per_second
            walls.append(time.perf_counter() - wall)
            tracer.step()
            with tracer.paused():  # reporting is not training traffic
                totals = torch.tensor([loss_sum, float(count)], dtype=torch.float64)
                slowest = torch.tensor([elapsed], dtype=torch.float64)
                dist.all_reduce(totals)
                dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            losses.append(float(totals[0] / totals[1]))
            times.append(float(slowest))
            if on_step is not None:
                on_step(step, losses[-1])
        comm = tracer.summary_of_max_sender()
        held = {kind: tensor_bytes(ts) for kind, ts in strategy.state_tensors().items()}
        with tracer.paused():
            everyone: list[dict] = [{} for _ in range(ctx.world_size)]
            dist.all_gather_object(everyone, held)
            timing, facts = strategy.timing(), strategy.report_facts()
    most_loaded = max(everyone, key=lambda h: sum(h.values()))
    report = {"strategy": cfg.strategy, "world_size": ctx.world_size, "losses": losses, "comm": comm,
              "state_bytes": {k: most_loaded.get(k, 0) for k in ("params", "grads", "optimizer")},
              "step_time_s": statistics.median(times), **facts}
    if em is not None:  # step_time_s is then the emulated device's; the wall time is this machine's
        report["emulated"] = {**em.report(), "wall_step_time_s": statistics.median(walls), **timing,
                              "mfu": mfu(cfg, report["step_time_s"], ctx.world_size, em.device.peak_flops)}
    return report


# -- launching: one process in place, or N ranks under torchrun -----------------------------------------
PROGRESS_TAG = "partrain-progress"


def launch(cfg: TrainConfig, on_step: Callable[[int, float], None] | None = None,
           echo: Callable[[int | None, str], None] | None = None, timeout: float | None = None) -> dict:
    """Train with `cfg` and return the report (the `train --json` object). One process runs here, in a
    world of one; more run under torchrun (`launcher.oneshot.torchrun`), their report published by rank 0.
    `on_step(step, loss)` follows progress (without one, a run longer than a few seconds shows a progress bar:
    `partrain_edu.progress`); `echo(rank, line)` receives the ranks' other output. After `timeout` seconds
    (None: no limit) the run is stopped, in this process or on every rank."""
    from partrain_edu.launcher import check_timeout

    timeout = check_timeout(timeout)
    _check_before_start(cfg)
    if on_step is not None:
        return _launch(cfg, on_step, echo, timeout)
    ranks = 1 if get_strategy(cfg.strategy).in_process else cfg.nproc
    with StepProgress(cfg.steps, f"{cfg.strategy} on {ranks} rank{'s' if ranks > 1 else ''}") as progress:
        return _launch(cfg, lambda step, loss: progress.step(step + 1), echo, timeout, progress.started)


def _check_before_start(cfg: TrainConfig) -> None:
    get_strategy(cfg.strategy).layout(cfg)  # every size check before a process starts
    check_emulation(cfg)


def _launch(cfg: TrainConfig, on_step: Callable[[int, float], None], echo: Callable[[int | None, str], None] | None,
            timeout: float | None, started: Callable[[int], None] | None = None) -> dict:
    from partrain_edu.launcher import call_with_timeout

    if cfg.nproc == 1 or get_strategy(cfg.strategy).in_process:
        torch.set_num_threads(1)  # as under torchrun (OMP_NUM_THREADS=1): the same numbers either way
        ctx = runtime.init(device=cfg.device)
        runtime.seed_everything(cfg.seed)
        try:
            return call_with_timeout(lambda: run(ctx, cfg, on_step=on_step), timeout)
        finally:
            runtime.shutdown()

    return _on_ranks([cfg], on_step, echo, timeout, started)[0]


def launch_all(cfgs: Sequence[TrainConfig], timeout: float | None = None) -> list[dict]:
    """Train each of `cfgs` in turn on the same ranks, in one torchrun launch, and return their reports. Each run
    re-creates the process group (and the emulated device) and re-seeds, so each report is `launch(cfg)`'s; the
    ranks start, and import torch, once instead of once per run. The configs share one `nproc` above 1."""
    from partrain_edu.launcher import check_timeout

    timeout = check_timeout(timeout)
    sizes = sorted({cfg.nproc for cfg in cfgs})
    if len(sizes) != 1 or sizes[0] == 1 or any(get_strategy(cfg.strategy).in_process for cfg in cfgs):
        raise ValueError(f"launch_all trains configs of one world size above 1 on the same ranks (got nproc "
                         f"{sizes}): launch the others apart, with launch(cfg)")
    for cfg in cfgs:
        _check_before_start(cfg)
    with StepProgress(sum(cfg.steps for cfg in cfgs), f"{len(cfgs)} runs on {sizes[0]} ranks") as progress:
        return _on_ranks(list(cfgs), lambda step, loss: progress.step(step + 1), None, timeout, progress.started)


def _on_ranks(cfgs: list[TrainConfig], on_step: Callable[[int, float], None],
              echo: Callable[[int | None, str], None] | None, timeout: float | None,
              started: Callable[[int], None] | None = None) -> list[dict]:
    from partrain_edu.launcher import torchrun

    def route(rank: int | None, text: str) -> None:
        if text.startswith(PROGRESS_TAG):
            _, step, _, loss = text.split()
            on_step(int(step) - 1, float(loss))
        elif echo is not None:
            echo(rank, text)

    runs = json.dumps([to_argv(cfg) for cfg in cfgs])
    result = torchrun("", nproc=cfgs[0].nproc, module="partrain_edu.train", args=["--progress", "--runs", runs],
                      echo=route, timeout=timeout, started=started or _quiet)
    return result.published["reports"]


def _quiet(up: int) -> None:
    """The ranks' count goes nowhere: the caller's `on_step` is how a run shows progress (the CLI's bar)."""


# -- the rank-side entry point `launch` starts under torchrun ------------------------------------------


def _rank_main() -> None:
    # `--runs '[[flags...], ...]'` (launch_all) trains each flag list in turn; without it, the flags are one run.
    # `--progress`: rank 0 prints one progress line per step, counted over all the runs.
    head = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    head.add_argument("--runs")
    head.add_argument("--progress", action="store_true")
    args, rest = head.parse_known_args()
    parser = argparse.ArgumentParser(prog="python -m partrain_edu.train")
    add_train_arguments(parser)
    # Under a bare torchrun, `--nproc` would be claimed by torchrun's own parser: default to the world size.
    parser.set_defaults(nproc=int(os.environ.get("WORLD_SIZE", 1)))
    cfgs = [config_from_args(parser.parse_args(argv)) for argv in (json.loads(args.runs) if args.runs else [rest])]
    total = sum(cfg.steps for cfg in cfgs)
    done = 0
    reports = []
    for cfg in cfgs:
        ctx = runtime.init(device=cfg.device)  # a fresh group, emulated clock and seed: as if launched alone
        runtime.seed_everything(cfg.seed)

        def progress(step: int, loss: float, done: int = done) -> None:
            if args.progress:
                runtime.print0(f"{PROGRESS_TAG} {done + step + 1} {total} {loss:.6f}")

        reports.append(run(ctx, cfg, on_step=progress))
        done += cfg.steps
    if os.environ.get(runtime.PUBLISH_DIR_ENV):
        runtime.publish("reports", reports)  # back to `launch` or `launch_all` in the parent process
    else:  # started by a bare torchrun (e.g. across nodes): rank 0 prints each report
        for report in reports:
            runtime.print0(json.dumps(report))
    runtime.shutdown()


if __name__ == "__main__":
    _rank_main()
