"""What a course strategy is: build TinyGPT and its optimizer, then turn a global batch into one optimizer step.

    partrain-edu train --strategy single --steps 20 --json

Every strategy trains the same TinyGPT (same init), on the same data, with the same global batch, fp32 master
weights and AdamW; it only decides where the bytes live and which bytes move, by wrapping the model in
`partrain_edu.parallel`'s pieces. So every loss curve must equal `single`'s, the oracle of every test (the
bf16 strategies, which compute and communicate in bf16, within 2⁻⁸: one bf16 rounding).
`train_step` returns (sum of the per-sample losses this rank accounts for, their number); the loop sums both
over ranks. `@register("name")` files a class under its name; `get_strategy(name)` imports the one module the
index names (`train_checks.STRATEGY_MODULES`, torch-free), `strategies()` all of them.
"""
from __future__ import annotations

import contextlib
import importlib
import re
from typing import Callable, ClassVar, Iterable

import torch

from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.data import data_parallel_slice, split_microbatches
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.fsdp import FullyShardedDataParallel
from partrain_edu.train_checks import STRATEGY_MODULES, check_global_batch  # torch-free: shared with the CLI

LEARNING_RATE = 3e-3


class Strategy:
    """One way to train TinyGPT. Subclasses set `self.model` / `self.optimizer`, and override `train_step`
    or one of its hooks when the default data-parallel step does not fit."""

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
        check_global_batch(cfg, dp)
        return dp, 1, 1

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        """One optimizer step on the global batch (x, y): the data-parallel step. This rank's slice of the
        batch, micro-batches accumulated (without communication until the last one when the model has DDP's
        `no_sync`), `sync_after_backward`, one optimizer step. Strategies whose communication lives in the
        model (DDP hooks, FSDP units) need nothing more."""
        x, y = data_parallel_batch(self, x, y)  # (B/dp, T) each
        self.optimizer.zero_grad(set_to_none=True)
        # DDP's no_sync only: ZeRO-3 reduce-scatters every micro-batch (FSDP's no_sync would keep full gradients)
        no_sync = None if isinstance(self.model, FullyShardedDataParallel) else getattr(self.model, "no_sync", None)
        loss_sum, count = self.accumulate(self.model, x, y, no_sync=no_sync)
        self.sync_after_backward()
        self.optimizer.step()
        return loss_sum, count

    def timing(self) -> dict:
        """Extra timing facts for the report, on the emulated device (every rank calls it): none by default."""
        return {}

    def report_facts(self) -> dict:
        """Extra measured facts for the JSON report, under the strategy's own key (every rank calls it, with
        the tracer paused; rank 0's are reported): none by default."""
        return {}

    def sync_after_backward(self) -> None:
        """Called once the step's backward passes are done (ddp-naive communicates here)."""

    def state_tensors(self) -> dict[str, Iterable[torch.Tensor]]:
        """The tensors that make up this rank's model states (strategies that shard them override this)."""
        params = list(self.model.parameters())
        return {"params": params,
                "grads": [p.grad for p in params if p.grad is not None],
                "optimizer": optimizer_state_tensors(self.optimizer)}

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


def _load(name: str) -> None:
    importlib.import_module(f"partrain_edu.strategies.{STRATEGY_MODULES[name]}")


def strategies() -> dict[str, type[Strategy]]:
    """Every registered strategy, by name, in the index's order (`train_checks.STRATEGY_MODULES`); imports them all."""
    for name in STRATEGY_MODULES:
        _load(name)
    return {name: STRATEGIES[name] for name in STRATEGY_MODULES}


def get_strategy(name: str) -> type[Strategy]:
    """The strategy registered as `name`, importing only its own module."""
    if name not in STRATEGY_MODULES:
        raise ValueError(f"unknown strategy {name!r}; choose one of: {', '.join(STRATEGY_MODULES)}")
    _load(name)
    return STRATEGIES[name]


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor an optimizer keeps (moments, momentum, `step`), for the state-bytes report."""
    return [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]


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


# The library names a size by its parameter (`tp=3`); in the harness that size is a flag, and the world
# size is `--nproc`. Layouts re-word the library's errors so the CLI's one line names the flag to change.
_LIBRARY_SIZE = re.compile(r"\b(dp|tp|pp|world_size)=(\d+)")
_FLAG_OF = {"world_size": "nproc"}


@contextlib.contextmanager
def in_flag_words():
    """Re-raise a library ValueError with its sizes as flags: `tp=3 does not divide …` → `--tp 3 does not …`."""
    try:
        yield
    except ValueError as error:
        words = _LIBRARY_SIZE.sub(lambda m: f"--{_FLAG_OF.get(m[1], m[1])} {m[2]}", str(error))
        raise ValueError(words) from error
