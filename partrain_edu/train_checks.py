"""`partrain-edu train`'s arguments checked before torch is imported, so that a bad one is refused at once.

    check_train_arguments(cfg)   # cfg: a TrainConfig built with `light_model()`: no torch anywhere

The rules for pipelines (`check_pipeline`), FSDP × TP's degrees (`fsdp_tp_degrees`) and the global batch
(`check_global_batch`) live here and the strategies call them. The others are the strategies' `layout`
(strategies/*.py) and `emulation.check`, which still run once torch is loaded. This module mirrors them by
strategy name, and tests/test_train_checks.py holds the two to agreement over a grid of layouts (and
STRATEGY_MODULES, MODEL to the registry and GPTConfig), so a new rule there fails a test here.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

# The registry's index: each strategy's name → the module of `partrain_edu.strategies` whose import registers it,
# in the order `partrain-edu train` lists them. `get_strategy(name)` imports that module alone, so that a rank
# of "ddp" never pays for DTensor's, FSDP2's or pipelining's imports (about 2 s of CPU a rank, before its first
# step). tests/test_layering.py holds the index to the registry.
STRATEGY_MODULES = {
    "single": "single", "torch-ddp": "torch_ddp", "ddp": "ddp", "ddp-naive": "ddp", "naive-dp": "naive_dp",
    "tp": "tensor", "tp-sp": "tensor", "torch-tp": "torch_tp", "pp-naive": "pipeline", "pp-gpipe": "pipeline",
    "pp-1f1b": "pipeline", "pp-interleaved": "pipeline", "pp-zb1": "pipeline", "torch-pp": "torch_pp",
    "torch-pp-zb": "torch_pp", "zero1": "zero", "zero2": "zero", "zero3": "fsdp", "torch-fsdp": "torch_fsdp",
    "3d": "hybrid", "3d-mesh": "hybrid", "cp": "context", "fsdp-tp": "fsdp_tp", "torch-fsdp-tp": "fsdp_tp",
    "ddp-bf16": "mixed_precision", "zero3-bf16": "mixed_precision", "torch-fsdp-bf16": "mixed_precision"}
MODEL = {"vocab_size": 128, "seq_len": 32, "n_layer": 4, "n_embd": 64, "n_head": 4}   # GPTConfig()'s sizes
EMULATED = ("single", "ddp", "ddp-naive", "zero1", "zero2", "zero3", "tp", "tp-sp", "cp", "fsdp-tp")


def light_model() -> SimpleNamespace:
    """TinyGPT's default sizes without importing models.py (and torch): what the checks read of `cfg.model`."""
    return SimpleNamespace(**MODEL)


def check_global_batch(cfg, dp: int) -> None:
    """Every data-parallel replica takes B/dp sequences, in `cfg.microbatches` equal micro-batches."""
    if cfg.global_batch % (dp * cfg.microbatches):
        raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by dp × microbatches = "
                         f"{dp} × {cfg.microbatches}")


def _microbatches(cfg) -> None:
    if cfg.global_batch % cfg.microbatches:
        raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by --microbatches {cfg.microbatches}")


def _divisible(model, tp: int, sequence_parallel: bool = False) -> None:
    sizes = [("hidden size", model.n_embd), ("number of attention heads", model.n_head),
             ("vocabulary", model.vocab_size)] + [("sequence length", model.seq_len)] * sequence_parallel
    common = math.gcd(*(n for _, n in sizes))
    fits = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
    for what, n in sizes:
        if n % tp:
            raise ValueError(f"--tp {tp} does not divide the {what} ({n}): every rank needs an equal slice; "
                             f"use --tp {fits}")


def _data_parallel(name: str, cfg) -> None:
    if name == "single" and (cfg.nproc != 1 or any((getattr(cfg, d) or 1) != 1 for d in ("dp", "tp", "pp"))):
        raise ValueError("single runs on one process: drop --nproc/--dp/--tp/--pp, or pick a parallel strategy")
    dp = cfg.dp or cfg.nproc
    if dp != cfg.nproc or (cfg.tp or 1) != 1 or (cfg.pp or 1) != 1:
        raise ValueError(f"{name} is data parallel only: use --dp {cfg.nproc} (= --nproc) and no --tp/--pp")
    check_global_batch(cfg, dp)


def _tensor(name: str, cfg) -> None:
    tp = cfg.tp or cfg.nproc
    if tp != cfg.nproc or (cfg.dp or 1) != 1 or (cfg.pp or 1) != 1:
        raise ValueError(f"{name} is tensor parallelism alone: give --tp equal to --nproc (got --tp {tp}, "
                         f"--nproc {cfg.nproc}) and no --dp/--pp; the 3d strategy combines them")
    _divisible(cfg.model, tp, name == "tp-sp")
    _microbatches(cfg)


def check_pipeline(cfg, name: str, chunks: int = 1) -> int:
    """p for a pipeline-only run of `cfg`, or a one-line ValueError naming the fix (the pipeline strategies' own)."""
    p, layers = cfg.pp or cfg.nproc, cfg.model.n_layer
    if p != cfg.nproc or (cfg.dp or 1) != 1 or (cfg.tp or 1) != 1:
        raise ValueError(f"{name} is pipeline parallelism alone: give --pp equal to --nproc (got --pp {p}, "
                         f"--nproc {cfg.nproc}) and no --dp/--tp; the 3d strategy combines them")
    if p * chunks > layers:
        raise ValueError(f"{name} needs --pp × {chunks} chunks ≤ the model's {layers} layers: use --pp "
                         f"{layers // chunks} or less" if chunks > 1 else
                         f"--pp {p} is more stages than the model's {layers} layers: use --pp {layers} or less")
    if chunks > 1 and cfg.microbatches % p:
        raise ValueError(f"{name} sends micro-batches in groups of --pp {p}: use --microbatches a multiple of "
                         f"{p} (got {cfg.microbatches})")
    _microbatches(cfg)
    return p


def _pipeline(name: str, cfg) -> None:
    check_pipeline(cfg, name, 2 if name == "pp-interleaved" else 1)


def _three_d(name: str, cfg) -> None:
    tp, pp = cfg.tp or 1, cfg.pp or 1
    dp = cfg.dp or cfg.nproc // (tp * pp) or 1
    if dp * tp * pp != cfg.nproc:
        raise ValueError(f"--dp {dp} × --tp {tp} × --pp {pp} = {dp * tp * pp} ranks, but there are "
                         f"{cfg.nproc}: pick sizes whose product is --nproc {cfg.nproc}")
    _divisible(cfg.model, tp)
    if pp > cfg.model.n_layer:
        raise ValueError(f"--pp {pp} is more stages than the model's {cfg.model.n_layer} layers: use --pp "
                         f"{cfg.model.n_layer} or less")
    check_global_batch(cfg, dp)


def _context(name: str, cfg) -> None:
    cp, seq = cfg.cp or cfg.nproc, cfg.model.seq_len
    if cp != cfg.nproc or any((getattr(cfg, d) or 1) != 1 for d in ("dp", "tp", "pp")):
        raise ValueError(f"{name} is context parallelism alone: give --cp equal to --nproc (got --cp {cp}, "
                         f"--nproc {cfg.nproc}) and no --dp/--tp/--pp")
    if seq % (2 * cp):
        fits = [c for c in range(1, seq // 2 + 1) if seq % (2 * c) == 0]
        raise ValueError(f"--cp {cp}: the zig-zag split needs 2 × cp chunks of the {seq} positions; "
                         f"use --cp {', '.join(map(str, fits))}")
    _microbatches(cfg)


def fsdp_tp_degrees(cfg, name: str) -> tuple[int, int]:
    """(dp, tp) of a 2D run, or a one-line ValueError (the fsdp-tp strategies' own)."""
    tp = cfg.tp or 1
    dp = cfg.dp or cfg.nproc // tp or 1
    if (cfg.pp or 1) != 1:
        raise ValueError(f"{name} is 2D, dp × tp: drop --pp (the 3d strategy adds pipeline stages)")
    if dp * tp != cfg.nproc:
        raise ValueError(f"--dp {dp} × --tp {tp} = {dp * tp} ranks, but there are {cfg.nproc}: pick sizes "
                         f"whose product is --nproc {cfg.nproc}")
    return dp, tp


def _fsdp_tp(name: str, cfg) -> None:
    dp, tp = fsdp_tp_degrees(cfg, name)
    _divisible(cfg.model, tp)
    check_global_batch(cfg, dp)


def _rule(name: str):
    if name in ("tp", "tp-sp", "torch-tp"):
        return _tensor
    if name.startswith(("pp-", "torch-pp")):
        return _pipeline
    return {"3d": _three_d, "3d-mesh": _three_d, "cp": _context, "fsdp-tp": _fsdp_tp,
            "torch-fsdp-tp": _fsdp_tp}.get(name, _data_parallel)


def check_train_arguments(cfg) -> None:
    """A one-line ValueError naming the fix, as the strategy's `layout` and `emulation.check` would raise."""
    if cfg.strategy not in STRATEGY_MODULES:
        raise ValueError(f"unknown strategy {cfg.strategy!r}; choose one of: {', '.join(STRATEGY_MODULES)}")
    _rule(cfg.strategy)(cfg.strategy, cfg)
    timed = cfg.strategy in EMULATED or cfg.strategy.startswith("pp-")
    if cfg.device != "cpu" and not timed:
        raise ValueError(f"--device {cfg.device}: {cfg.strategy} cannot be timed on the emulated device (its "
                         f"communication is out of reach); use one of {', '.join(EMULATED)} or pp-*")
