"""The ``memory``, ``traffic``, ``pipeline`` and ``plan`` subcommands of ``partrain-edu``.

    partrain-edu memory --params 7.5e9 --dp 64 --zero 3 --json
    partrain-edu traffic --strategy zero3 --params 7.5B --dp 64
    partrain-edu pipeline --stages 4 --microbatches 8 --schedule 1f1b
    partrain-edu plan --params 175B --gpus 1024 --gpu-memory 80GB
    partrain-edu traffic --strategy cp --cp 4 --layers 32 --hidden 4096 --seq 131072 --micro-batch 1

``add_subcommands(subparsers)`` registers them on the main parser; each sets ``func`` to a handler that
prints one JSON object with ``--json`` (else a table for people) and returns 0. On bad input a handler
raises ValueError with one line naming the fix; ``partrain_edu/cli.py`` prints it and exits 2. Argument
types raise ``argparse.ArgumentTypeError`` with the same words, so argparse reports them in one line too.

Every command answers within seconds: sizes stop at 1e18 (``units.MAX_SIZE``), durations at ``MAX_SECONDS``,
the pipeline simulator at ``MAX_STAGES`` stages and ``MAX_PIPELINE_ACTIONS`` actions, and no result beyond
``cli_model.MAX_RESULT`` is printed (such counts of layers, heads or tokens describe no machine).
"""

from __future__ import annotations

import argparse

from partrain_edu.theory.cli_model import (
    DEGREES,
    add_estimate,
    add_layout_flags,
    add_model_flags,
    add_stack_flags,
    emit,
    layout_from,
    model_from,
)
from partrain_edu.theory.hardware import canonical
from partrain_edu.theory.layout import STACK
from partrain_edu.theory.memory import OPTIMIZERS, PRECISIONS, RECOMPUTE, estimate_memory
from partrain_edu.theory.planner import GLOBAL_BATCH, SEQ, plan
from partrain_edu.theory.schedules import SCHEDULES, build_schedule, simulate
from partrain_edu.theory.traffic import LINKS, STRATEGIES, step_traffic
from partrain_edu.units import parse_size

MAX_SECONDS = 1e9               # ≈ 30 years per stage action; keeps a simulated makespan inside float range
# The simulator sweeps every stage until nothing moves: its time grows with stages × (stages + micro-batches)
# and with the number of actions. These limits keep the slowest schedule (zb-h1) to a few seconds here.
MAX_STAGES = 256
MAX_PIPELINE_ACTIONS = 20_000   # --stages × --microbatches × --chunks


def size(text: str) -> int:
    """argparse type: a positive size such as 7.5e9, 7.5B, 350M, 80GB (units.parse_size)."""
    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# A size written without a unit is read as parameters or bytes. Below a million it is almost surely a unit left
# out ("--params 70" for 70B, "--gpu-memory 80" for 80GB), and no distributed-training question is about it.
UNITLESS_FLOOR = 10**6


def _with_unit(text: str, unit: str, examples: str) -> int:
    value = size(text)
    if value < UNITLESS_FLOOR and text.strip().replace(".", "", 1).isdigit():
        raise argparse.ArgumentTypeError(f"{text.strip()} would be {value:,} {unit}: write the unit, e.g. "
                                         f"{examples}")
    return value


def params(text: str) -> int:
    """argparse type: a parameter count; a bare number under a million is refused (70 means 70B, surely)."""
    return _with_unit(text, "parameters", f"{text.strip()}B or {text.strip()}M (or 7.5e9)")


def memory_bytes(text: str) -> int:
    """argparse type: bytes; a bare number under a million is refused (80 means 80GB, surely)."""
    return _with_unit(text, "bytes", f"{text.strip()}GB or {text.strip()}GiB")


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1 (degrees, counts of layers, stages, micro-batches)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number such as 4, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def seconds(text: str) -> float:
    """argparse type: a duration >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 1.5, got {text!r}") from None
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 and at most 1e9, got {text!r}")
    return value


def run_memory(args: argparse.Namespace) -> int:
    if args.sequence_parallel and (args.micro_batch is None or args.tp == 1):
        raise ValueError("--sequence-parallel splits activations over the --tp ranks: give --tp 2 or more and "
                         "the activation flags (--layers, --hidden, --heads, --seq, --micro-batch), or drop it")
    if args.cp > 1 and args.micro_batch is None:
        raise ValueError("--cp splits the activations by sequence (the model states stay whole): give the activation "
                         "flags (--layers, --hidden, --heads, --seq, --micro-batch), or drop it")
    return emit(args, estimate_memory(
        args.params, dp=args.dp, tp=args.tp, pp=args.pp, zero=args.zero, precision=args.precision,
        optimizer=args.optimizer, layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq,
        micro_batch=args.micro_batch, vocab=args.vocab, recompute=args.recompute,
        sequence_parallel=args.sequence_parallel, cp=args.cp))


def run_traffic(args: argparse.Namespace) -> int:
    if args.cp > 1 and args.strategy != "cp":
        raise ValueError(f"--cp is the ring of --strategy cp; --strategy {args.strategy} sends nothing along it: "
                         "use --strategy cp, or drop --cp")
    return emit(args, step_traffic(
        args.strategy, args.params, dp=args.dp, tp=args.tp, pp=args.pp, cp=args.cp, layers=args.layers,
        hidden=args.hidden, seq=args.seq, micro_batch=args.micro_batch, microbatches=args.microbatches,
        bytes_per_element=args.bytes_per_element))


def run_pipeline(args: argparse.Namespace) -> int:
    chunks = args.chunks if args.chunks is not None else (2 if args.schedule == "interleaved" else 1)
    if args.stages > MAX_STAGES:
        raise ValueError(f"--stages must be at most {MAX_STAGES}, got {args.stages}: simulating more takes "
                         "minutes; a smaller pipeline shows the same schedule")
    if args.stages * args.microbatches * chunks > MAX_PIPELINE_ACTIONS:
        raise ValueError(f"--stages × --microbatches × --chunks must be at most {MAX_PIPELINE_ACTIONS:,}, got "
                         f"{args.stages} × {args.microbatches} × {chunks}: simulating more takes minutes; "
                         "use fewer stages or micro-batches")
    schedule = build_schedule(args.schedule, args.stages, args.microbatches, chunks)
    split = schedule.split_backward   # zb-h1: the backward's two halves, B and W, each as long as a forward
    t_backward = args.t_backward if args.t_backward is not None else (1.0 if split else 2.0)
    t_weight = args.t_weight if args.t_weight is not None else (1.0 if split else 0.0)
    return emit(args, simulate(schedule, args.t_forward, t_backward, t_weight))


def run_plan(args: argparse.Namespace) -> int:
    shape_given = args.model or args.gated or args.untied or any(
        getattr(args, name) is not None for name in ("layers", "hidden", "heads", "vocab", "kv_heads", "ffn",
                                                     "experts", "top_k", "moe_ffn", "moe_layers"))
    model = model_from(args) if shape_given else None      # else --params: GPT-3's shape of that size, at --seq
    if model is None and args.params is None:
        raise ValueError("plan needs a model: --params N (a GPT-3-like shape), --model PRESET, or the shape flags")
    if model is None and args.gpu_memory is None and args.device is None:
        raise ValueError("plan --params needs --gpu-memory (e.g. 80GB), or --device NAME for its memory")
    given = None
    if any(getattr(args, name) is not None for name in DEGREES + ("zero", "micro_batch", "recompute")):
        args.dp = args.dp or max(1, args.gpus // ((args.tp or 1) * (args.pp or 1) * (args.cp or 1)))
        given = layout_from(args, args.global_batch)
    features = {k: getattr(args, k) for k in STACK if k != "network_gbps" or args.network_gbps}
    return emit(args, plan(args.params, args.gpus, args.gpu_memory, args.gpus_per_node, args.interconnect,
                            global_batch=args.global_batch, seq=args.seq or SEQ, model=model,
                            device=canonical(args.device) if args.device else None, given=given, features=features))


def _json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def add_subcommands(subparsers) -> None:
    """Register memory, traffic, pipeline and plan on ``subparsers`` (from ``parser.add_subparsers``)."""
    p = subparsers.add_parser("memory", help="bytes per device: params, grads, optimizer, activations",
                              description="Model-state and activation bytes per device (ZeRO, Korthikanti).")
    p.add_argument("--params", type=params, help="parameter count, e.g. 7.5e9 or 7.5B")
    for flag in ("--dp", "--tp", "--pp"):
        p.add_argument(flag, type=positive_int, default=1, help="parallel degree (default 1)")
    p.add_argument("--cp", type=positive_int, default=1,
                   help="context-parallel degree: splits the activations by sequence (default 1)")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0, help="ZeRO stage over --dp")
    p.add_argument("--precision", choices=PRECISIONS, default="mixed")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adam")
    p.add_argument("--layers", type=positive_int)
    p.add_argument("--hidden", type=positive_int)
    p.add_argument("--heads", type=positive_int)
    p.add_argument("--seq", type=positive_int, help="sequence length in tokens")
    p.add_argument("--micro-batch", type=positive_int, help="sequences per micro-batch (enables activations)")
    p.add_argument("--vocab", type=positive_int)
    p.add_argument("--recompute", choices=RECOMPUTE, default="none")
    p.add_argument("--sequence-parallel", action="store_true")
    _json_flag(p)
    p.set_defaults(func=run_memory)

    p = subparsers.add_parser("traffic", help="bytes each rank sends per training step",
                              description="Per-rank bytes of one training step under the ring cost model.")
    p.add_argument("--strategy", choices=STRATEGIES, required=True)
    p.add_argument("--params", type=params, help="parameter count, e.g. 7.5e9 or 7.5B")
    for flag in ("--dp", "--tp", "--pp"):
        p.add_argument(flag, type=positive_int, default=1)
    p.add_argument("--cp", type=positive_int, default=1, help="ranks sharing each sequence (--strategy cp)")
    p.add_argument("--layers", type=positive_int)
    p.add_argument("--hidden", type=positive_int)
    p.add_argument("--seq", type=positive_int)
    p.add_argument("--micro-batch", type=positive_int)
    p.add_argument("--microbatches", type=positive_int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--bytes-per-element", type=positive_int, default=2)
    _json_flag(p)
    p.set_defaults(func=run_traffic)

    p = subparsers.add_parser("pipeline", help="simulate a pipeline schedule: makespan, bubble, activations",
                              description="Simulate a pipeline schedule with per-stage action lists.")
    p.add_argument("--stages", type=positive_int, required=True)
    p.add_argument("--microbatches", type=positive_int, required=True)
    p.add_argument("--schedule", choices=SCHEDULES, default="1f1b")
    p.add_argument("--chunks", type=positive_int, help="model chunks per stage (interleaved; default 2)")
    p.add_argument("--t-forward", type=seconds, default=1.0, help="forward time of one stage (default 1)")
    p.add_argument("--t-backward", type=seconds, help="backward (input grad) time (default 2; zb-h1: 1)")
    p.add_argument("--t-weight", type=seconds, help="weight-grad time, separate in zb-h1 (default 0; zb-h1: 1)")
    _json_flag(p)
    p.set_defaults(func=run_pipeline)

    p = subparsers.add_parser("plan", help="which strategy for this model on these GPUs",
                              description="Every layout that fits, priced by the calibrated model (estimate); "
                                          "the simplest good one, the three fastest, and a layout you give.")
    p.add_argument("--params", type=params,
                   help="parameter count of a GPT-3-like model, e.g. 70B (or --model / the shape)")
    p.add_argument("--gpus", type=positive_int, required=True)
    p.add_argument("--gpu-memory", type=memory_bytes, help="bytes per GPU, e.g. 80GB (default: the --device's)")
    add_model_flags(p, positive_int, device_default=None)
    add_layout_flags(p, positive_int, defaults=False)
    add_stack_flags(p)
    p.add_argument("--gpus-per-node", type=positive_int, default=8)
    p.add_argument("--interconnect", choices=tuple(LINKS), default="infiniband", help="link between nodes")
    p.add_argument("--global-batch", type=positive_int, default=GLOBAL_BATCH,
                   help=f"sequences per step (default {GLOBAL_BATCH}); at most one data-parallel replica each")
    _json_flag(p)
    p.set_defaults(func=run_plan)
    add_estimate(subparsers, positive_int, _json_flag, memory_bytes)
