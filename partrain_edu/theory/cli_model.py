"""The ``estimate`` subcommand, and the model, device and layout flags it shares with ``plan``.

    partrain-edu estimate --model llama3-405b --device h100-sxm --tp 8 --pp 16 --vpp 8 --dp 64 --zero 2 \\
        --global-batch 2048
    partrain-edu estimate --layers 24 --hidden 2048 --heads 16 --vocab 50257 --seq 2048 --device a100 --dp 8 --json

A model is a preset (``--model``, `model_spec.MODELS`, whose fields single flags may override: ``--seq 131072``) or
its shape (``--layers --hidden --heads --vocab --seq`` and optionally ``--kv-heads --ffn --gated --untied
--experts --top-k --moe-ffn``). Bad input raises ValueError with one line naming the flag (``cli.py`` exits 2).
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from partrain_edu.theory.estimate import estimate
from partrain_edu.theory.hardware import PRESETS, canonical
from partrain_edu.theory.layout import ATTENTION, SCHEDULES, STACK, Layout
from partrain_edu.theory.model_spec import MODELS, RECOMPUTE, ModelSpec, model_named

SHAPE = ("layers", "hidden", "heads", "vocab", "seq")
EXTRA = ("kv_heads", "ffn", "experts", "top_k", "moe_ffn", "moe_layers")
DEGREES = ("tp", "pp", "vpp", "dp", "cp", "ep")


def add_model_flags(p: argparse.ArgumentParser, positive_int, device_default: str | None = "h100-sxm") -> None:
    g = p.add_argument_group("model (a preset, or its shape)")
    g.add_argument("--model", help=f"a preset: {', '.join(MODELS)}")
    for name in SHAPE + EXTRA:
        g.add_argument("--" + name.replace("_", "-"), type=positive_int)
    g.add_argument("--gated", action="store_true", help="a gated (SwiGLU) MLP: three matrices")
    g.add_argument("--untied", action="store_true", help="an output head apart from the input embedding")
    g.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=None,
                   help="dropout layers and their masks (default: a preset's; a shape: on unless --gated)")
    p.add_argument("--device", default=device_default, help=f"a GPU preset: {', '.join(PRESETS)} (or a100, h100)")


def add_layout_flags(p: argparse.ArgumentParser, positive_int, defaults: bool = True) -> None:
    g = p.add_argument_group("layout")
    for name in DEGREES:
        g.add_argument("--" + name, type=positive_int, default=1 if defaults else None,
                       help="parallel degree" + (" (default 1)" if defaults else ""))
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0 if defaults else None)
    g.add_argument("--micro-batch", type=positive_int, default=1 if defaults else None,
                   help="sequences per micro-batch")
    g.add_argument("--recompute", choices=RECOMPUTE, default="none" if defaults else None)
    g.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule (default 1f1b; interleaved with --vpp)")


def model_from(args: argparse.Namespace, required: bool = True) -> ModelSpec | None:
    """The ModelSpec the flags describe; None when none is described and not `required`."""
    given = {name: getattr(args, name) for name in SHAPE + EXTRA if getattr(args, name, None) is not None}
    if args.model:
        model = model_named(args.model)
        flags = ({"gated": True} if args.gated else {}) | ({} if args.dropout is None else {"dropout": args.dropout})
        return replace(model, **given, **flags, **({"tied_embeddings": False} if args.untied else {}))
    if not given and not args.gated and not args.untied and not required:
        return None
    missing = [f"--{n}" for n in SHAPE if n not in given]
    if missing:
        raise ValueError(f"give --model PRESET ({', '.join(MODELS)}), or the shape: missing {' '.join(missing)}")
    dropout = not args.gated if args.dropout is None else args.dropout
    return ModelSpec("custom", **given, gated=args.gated, tied_embeddings=not args.untied,
                     learned_positions=not args.gated, bias=not args.gated, dropout=dropout)


MAX_RESULT = 10**30             # bytes, counts or seconds: ten million times all the world's storage


def _too_large(value) -> bool:
    """Whether any number inside a result (nested dicts and lists) is beyond MAX_RESULT."""
    if isinstance(value, dict):
        return any(_too_large(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_too_large(v) for v in value)
    return isinstance(value, (int, float)) and not value <= MAX_RESULT


def emit(args: argparse.Namespace, result) -> int:
    """Print a result (`--json`: its dict; else its table), refusing numbers no real machine has."""
    data = result.to_dict()
    # Positive whole numbers have no upper bound on the command line: --seq 10**40 computes fine, but its
    # 100-digit result is no answer (and would overflow the float maths of the tables).
    if _too_large(data):
        raise ValueError("the result is beyond 1e30, which describes no real machine; "
                         "give realistic sizes (--layers, --hidden, --heads, --seq, --micro-batch, ...)")
    print(json.dumps(data) if args.json else result.table())
    return 0


def add_stack_flags(p: argparse.ArgumentParser) -> None:
    """One flag per `layout.STACK` field: what the frameworks do differently (docs/cli.md)."""
    g = p.add_argument_group("software stack and cluster (defaults: a 2024 Megatron-Core / PyTorch stack on DGX)")
    g.add_argument("--attention", choices=ATTENTION, default="flash2",
                   help="attention kernel: FlashAttention 3 (Hopper), 2, 1, or unfused s×s scores (default flash2)")
    g.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction, default=True,
                   help="with tp > 1, norms and dropout split by sequence (Korthikanti et al. 2022; default on)")
    g.add_argument("--grad-bytes", type=int, choices=(2, 4, 6), default=4,
                   help="bytes per gradient held and reduced: 4 fp32 (default), 2 bf16, 6 DeepSpeed's bf16 + fp32")
    g.add_argument("--overlap-dp", action=argparse.BooleanOptionalAction, default=True,
                   help="gradients reduced during backward, FSDP's gathers prefetched (default on)")
    g.add_argument("--overlap-param-gather", action="store_true",
                   help="ZeRO-1/2's weight all-gather hidden in the next forward (Megatron-Core)")
    g.add_argument("--tp-comm-overlap", action="store_true",
                   help="TP's collectives beside the GEMMs (Megatron-Core --tp-comm-overlap, async TP)")
    g.add_argument("--network-gbps", type=float, default=0.0,
                   help="network bandwidth per GPU in Gb/s (default: the device's NIC, 400 on H100, 200 on A100)")


def layout_from(args: argparse.Namespace, global_batch: int | None) -> Layout:
    kw = {name: getattr(args, name) for name in DEGREES + ("zero", "micro_batch", "recompute") + STACK
          if getattr(args, name, None) is not None}
    if kw.get("network_gbps", 0) < 0 or kw.get("network_gbps") != kw.get("network_gbps"):
        raise ValueError(f"--network-gbps must be a positive number of Gb/s, got {args.network_gbps!r}")
    return Layout(**kw, global_batch=global_batch or 0, schedule=args.schedule or "",
                  gpus_per_node=args.gpus_per_node)


def run_estimate(args: argparse.Namespace) -> int:
    from partrain_edu.theory.fit_hint import fits_with

    model = model_from(args)
    device = canonical(args.device)
    result = estimate(model, layout_from(args, args.global_batch).check(model), device, memory_bytes=args.gpu_memory)
    code = emit(args, result)
    if not result.fits and not args.json:
        print(f"  hint: {fits_with(model, result.layout, device, args.gpu_memory)}")
    return code


def add_estimate(subparsers, positive_int, json_flag, memory_bytes) -> None:
    p = subparsers.add_parser("estimate", help="one layout on real GPUs: memory, fit, step time, MFU",
                              description="Memory per GPU, step time, throughput and MFU of one layout, from the "
                                          "model calibrated on published runs (theory.calibration).")
    add_model_flags(p, positive_int)
    add_layout_flags(p, positive_int)
    add_stack_flags(p)
    p.add_argument("--gpus-per-node", type=positive_int, default=8, help="GPUs per node (default 8): a group wider "
                   "than this crosses the network")
    p.add_argument("--gpu-memory", type=memory_bytes, help="bytes per GPU, e.g. 94GB (default: the --device's HBM)")
    p.add_argument("--global-batch", type=positive_int, help="sequences per step (default dp × micro-batch)")
    json_flag(p)
    p.set_defaults(func=run_estimate)
