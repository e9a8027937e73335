"""The one training loop every strategy shares, and the strategy registry behind `partrain-edu train`.

    partrain-edu train --strategy single --steps 20 --json
    partrain-edu train --strategy torch-ddp --nproc 2 --steps 20 --json

Every strategy trains the same TinyGPT (same init), on the same synthetic data, with the same global batch,
fp32 and AdamW. A strategy only decides *where the bytes live and which bytes move*: how it builds its model
and optimizer, and how it turns the step's global batch into one optimizer step. So every loss curve must
equal `single`'s — the oracle every test in this project compares against.

The loop measures, for the JSON report (see DESIGN.md):
- losses: the global-batch mean loss of each step (reported with the tracer paused: it is not training traffic);
- comm: per step, the collectives of the rank that sends most, bytes under the ring cost model (`CommTracer`);
- state_bytes: parameters, gradients and optimizer states resident on the most-loaded rank, read from tensors;
- step_time_s: the median over steps of the slowest rank's step time.

A strategy registers itself with `@register("name")`; later chapters add theirs (ddp, zero1..3, tp, pp-*, 3d).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable

import torch
import torch.distributed as dist

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens, data_parallel_slice, split_microbatches
from partrain_edu.models import GPTConfig, TinyGPT

LEARNING_RATE = 3e-3
# Modules whose import registers strategies (each later chapter appends its own).
STRATEGY_MODULES = [
    "partrain_edu.parallel.torch_native",
    "partrain_edu.parallel.ddp",
    "partrain_edu.parallel.naive_dp",
    "partrain_edu.parallel.tensor",
    "partrain_edu.parallel.sequence",
    "partrain_edu.parallel.torch_tp",
    "partrain_edu.parallel.pipeline",
    "partrain_edu.parallel.torch_pp",
    "partrain_edu.parallel.zero",
    "partrain_edu.parallel.fsdp",
    "partrain_edu.parallel.torch_fsdp",
    "partrain_edu.parallel.hybrid",
]


@dataclass(frozen=True)
class TrainConfig:
    strategy: str = "single"
    nproc: int = 1
    steps: int = 20
    seed: int = 0
    global_batch: int = 16
    microbatches: int = 1
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    model: GPTConfig = field(default_factory=GPTConfig)

    def __post_init__(self):
        for name in ("nproc", "steps", "global_batch", "microbatches"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        for name in ("dp", "tp", "pp"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"--seed must be non-negative, got {self.seed}")


class Strategy:
    """One way to train TinyGPT. Subclasses set `self.model` / `self.optimizer` and implement `train_step`."""

    name: ClassVar[str]
    # True for a strategy that runs all its workers inside one process (naive-dp's threads): `launch` runs it
    # in place in a world of one, whatever --nproc says, and --nproc is its number of workers.
    in_process: ClassVar[bool] = False
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer

    def __init__(self, ctx: runtime.ParallelContext, cfg: TrainConfig):
        self.ctx, self.cfg = ctx, cfg
        self.dp, self.tp, self.pp = self.layout(cfg)

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        """(dp, tp, pp) this strategy runs with; raises ValueError naming the fix for a bad combination.
        The default is pure data parallelism over every process."""
        dp = cfg.dp or cfg.nproc
        if dp != cfg.nproc or (cfg.tp or 1) != 1 or (cfg.pp or 1) != 1:
            raise ValueError(f"{cls.name} is data parallel only: use --dp {cfg.nproc} (= --nproc) and no --tp/--pp")
        if cfg.global_batch % (dp * cfg.microbatches):
            raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by dp × microbatches = "
                             f"{dp} × {cfg.microbatches}")
        return dp, 1, 1

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """Take one optimizer step on the global batch (x, y). Return (sum of per-sample losses this rank
        accounts for, number of those samples); the loop sums both over ranks to get the global mean.

        The default is the data-parallel step: this rank's slice of the batch, micro-batches accumulated
        (without communication until the last one when the model has DDP's `no_sync`), one optimizer step.
        Strategies whose communication lives in the model (DDP hooks, FSDP units) need nothing more."""
        x, y = data_parallel_batch(self, x, y)  # (B/dp, T) each
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, count = self.accumulate(self.model, x, y, no_sync=getattr(self.model, "no_sync", None))
        self.optimizer.step()
        return loss_sum, count

    def state_tensors(self) -> dict[str, Iterable[torch.Tensor]]:
        """The tensors that make up this rank's model states (strategies that shard them override this)."""
        params = list(self.model.parameters())
        return {"params": params,
                "grads": [p.grad for p in params if p.grad is not None],
                "optimizer": [t for state in self.optimizer.state.values() for t in state.values()
                              if isinstance(t, torch.Tensor)]}

    # -- pieces shared by the strategies ------------------------------------------------------------
    def new_model(self) -> TinyGPT:
        return TinyGPT(self.cfg.model, init_seed=self.cfg.seed).to(self.ctx.device)

    def new_optimizer(self, params) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=LEARNING_RATE)

    def accumulate(self, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
                   no_sync: Callable | None = None) -> tuple[float, int]:
        """Forward and backward over `cfg.microbatches` micro-batches of (x, y), gradients summed with weight
        1/M so they equal one big batch's. `no_sync` (DDP) skips communication on all but the last."""
        chunks = split_microbatches(x.to(self.ctx.device), y.to(self.ctx.device), self.cfg.microbatches)
        loss_sum = 0.0
        for i, (xb, yb) in enumerate(chunks):
            last = i == len(chunks) - 1
            with (no_sync() if no_sync is not None and not last else contextlib.nullcontext()):
                loss = TinyGPT.loss(model(xb), yb)
                (loss / len(chunks)).backward()
            loss_sum += loss.item() * xb.size(0)
        return loss_sum, x.size(0)


STRATEGIES: dict[str, type[Strategy]] = {}


def register(name: str):
    def decorate(cls: type[Strategy]) -> type[Strategy]:
        cls.name = name
        STRATEGIES[name] = cls
        return cls
    return decorate


def strategies() -> dict[str, type[Strategy]]:
    for module in STRATEGY_MODULES:
        importlib.import_module(module)
    return STRATEGIES


def get_strategy(name: str) -> type[Strategy]:
    known = strategies()
    if name not in known:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(known)}")
    return known[name]


@register("single")
class Single(Strategy):
    """The reference: one process, the whole global batch, plain autograd and AdamW."""

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        if cfg.nproc != 1 or (cfg.dp or 1) != 1 or (cfg.tp or 1) != 1 or (cfg.pp or 1) != 1:
            raise ValueError("single runs on one process: drop --nproc/--dp/--tp/--pp, or pick a parallel strategy")
        return super().layout(cfg)

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.model = self.new_model()
        self.optimizer = self.new_optimizer(self.model.parameters())


def data_parallel_batch(strategy: Strategy, x: torch.Tensor, y: torch.Tensor):
    """This rank's slice of the global batch (its data-parallel rank is its global rank)."""
    return data_parallel_slice(x, y, strategy.ctx.rank, strategy.dp)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes held, each storage counted once (tied or viewed tensors must not be counted twice)."""
    seen, total = set(), 0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor's bytes are its local shard's
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), local.numel())
        if key not in seen:
            seen.add(key)
            total += local.numel() * local.element_size()
    return total


def run(ctx: runtime.ParallelContext, cfg: TrainConfig, on_step: Callable[[int, float], None] | None = None,
        strategy: Strategy | None = None) -> dict:
    """Train `cfg.steps` steps on this rank; every rank returns the same report. The strategy is built from
    `cfg.strategy` unless an already-built one is given (tests and notebooks that vary its options)."""
    kind = type(strategy) if strategy is not None else get_strategy(cfg.strategy)
    if ctx.world_size != (1 if kind.in_process else cfg.nproc):
        raise ValueError(f"--nproc {cfg.nproc} does not match the {ctx.world_size} ranks torchrun started")
    strategy = strategy if strategy is not None else kind(ctx, cfg)
    data = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=cfg.seed)
    losses, times = [], []
    tracer = CommTracer()
    with tracer:
        for step in range(cfg.steps):
            x, y = data.global_batch(step, cfg.global_batch)
            start = time.perf_counter()
            loss_sum, count = strategy.train_step(x, y)
            elapsed = time.perf_counter() - start
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
    most_loaded = max(everyone, key=lambda h: sum(h.values()))
    return {"strategy": cfg.strategy, "world_size": ctx.world_size, "losses": losses, "comm": comm,
            "state_bytes": {k: most_loaded.get(k, 0) for k in ("params", "grads", "optimizer")},
            "step_time_s": statistics.median(times)}


# -- launching: one process in place, or N ranks under torchrun -----------------------------------------
PROGRESS_TAG = "partrain-progress"


def launch(cfg: TrainConfig, on_step: Callable[[int, float], None] | None = None,
           echo: Callable[[int | None, str], None] | None = None, timeout: float | None = None) -> dict:
    """Train with `cfg` and return the report (the `train --json` object). One process runs here, in a
    world of one; more run under torchrun (`partrain_edu.launch.torchrun`), their report published by rank 0.
    `on_step(step, loss)` follows progress; `echo(rank, line)` receives the ranks' other output."""
    get_strategy(cfg.strategy).layout(cfg)  # every size check before a process starts
    if cfg.nproc == 1 or get_strategy(cfg.strategy).in_process:
        torch.set_num_threads(1)  # as under torchrun (OMP_NUM_THREADS=1): the same numbers either way
        ctx = runtime.init()
        runtime.seed_everything(cfg.seed)
        try:
            return run(ctx, cfg, on_step=on_step)
        finally:
            runtime.shutdown()
    from partrain_edu.launch import torchrun

    def route(rank: int | None, text: str) -> None:
        if text.startswith(PROGRESS_TAG):
            _, step, _, loss = text.split()
            if on_step is not None:
                on_step(int(step) - 1, float(loss))
        elif echo is not None:
            echo(rank, text)

    extra = ["--progress"] if on_step is not None else []
    result = torchrun("", nproc=cfg.nproc, module="partrain_edu.train", args=to_argv(cfg) + extra,
                      echo=route, timeout=timeout)
    return result.published["report"]


# -- the rank-side entry point `launch` starts under torchrun ------------------------------------------


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(strategy=args.strategy, nproc=args.nproc, steps=args.steps, seed=args.seed,
                       global_batch=args.global_batch, microbatches=args.microbatches,
                       dp=args.dp, tp=args.tp, pp=args.pp)


def to_argv(cfg: TrainConfig) -> list[str]:
    argv = [f"--strategy={cfg.strategy}", f"--nproc={cfg.nproc}", f"--steps={cfg.steps}", f"--seed={cfg.seed}",
            f"--global-batch={cfg.global_batch}", f"--microbatches={cfg.microbatches}"]
    return argv + [f"--{k}={getattr(cfg, k)}" for k in ("dp", "tp", "pp") if getattr(cfg, k) is not None]


def _rank_main() -> None:
    from partrain_edu.cli import add_train_arguments

    parser = argparse.ArgumentParser(prog="python -m partrain_edu.train")
    add_train_arguments(parser)
    parser.add_argument("--progress", action="store_true", help="rank 0 prints one progress line per step")
    # Under a bare torchrun, `--nproc` would be claimed by torchrun's own parser: default to the world size.
    parser.set_defaults(nproc=int(os.environ.get("WORLD_SIZE", 1)))
    args = parser.parse_args()
    cfg = config_from_args(args)
    ctx = runtime.init()
    runtime.seed_everything(cfg.seed)

    def progress(step: int, loss: float) -> None:
        if args.progress:
            runtime.print0(f"{PROGRESS_TAG} {step + 1} {cfg.steps} {loss:.6f}")

    report = run(ctx, cfg, on_step=progress)
    if os.environ.get(runtime.PUBLISH_DIR_ENV):
        runtime.publish("report", report)  # back to `launch` in the parent process
    else:  # started by a bare torchrun (e.g. across nodes): rank 0 prints the report
        runtime.print0(json.dumps(report))
    runtime.shutdown()


if __name__ == "__main__":
    # Run the imported module's copy: strategies register into `partrain_edu.train.STRATEGIES`, not
    # into this `__main__` copy of the file.
    from partrain_edu.train import _rank_main as main

    main()
