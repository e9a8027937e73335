"""Which strategy for this model on these GPUs? The source notes' decision order, then a small search.

    partrain-edu plan --params 13B --gpus 64 --gpu-memory 80GB --json     # → fsdp, ZeRO-3 over 64

The notes' decision order (80 GB as the yardstick; squeeze one device first with mixed precision,
activation recompute and gradient accumulation):

1. parameters + optimizer states fit one device (≈ ≤ 2B on 80 GB)   → DDP
2. they don't, but sharded they do (≈ 3–30B)                       → FSDP FULL_SHARD / ZeRO-3
3. beyond (> 30B, or sharding alone is too slow)                    → TP inside a node (≤ GPUs per node,
   NVLink) + PP across nodes + DP outside: "3d" (Megatron-LM, Narayanan et al. 2021 §3)

and "TP/PP cost far more engineering than FSDP: only when necessary"; FSDP's extra traffic "must be hidden
by prefetching and overlapping it with compute". As code: we enumerate every layout (dp, tp, pp, ZeRO stage,
micro-batch size, recompute) of the GPUs, keep those that fit memory, estimate each one's step time, and
take the simplest family (ddp, then fsdp) whose best layout hides its data-parallel traffic behind compute
and is within ``SIMPLICITY_MARGIN`` of the fastest layout; failing both, the fastest layout of "fsdp-tp"
(ZeRO-3 over dp with tp inside a node, no pipeline: FSDP × TP, 2D), "3d" or "cp", a tie going to the first.
So the thresholds above are not typed in; they come out of the memory and traffic models. With the
constants below, on 80 GB GPUs over InfiniBand: DDP up to ≈4B; FSDP up to ≈80B on 64 GPUs (8 GPUs run
out of memory at ≈40B); 3d beyond. On 512 GPUs the fixed batch leaves each GPU so little compute that even
a 1.3B model's all-reduce no longer hides, and FSDP × TP wins at most sizes (pass a bigger ``global_batch``).
The batch also caps dp: each replica needs a whole sequence (``theory.batch_limit``), so a small batch on many
GPUs forces tp, pp or cp.

Assumptions, all constants below: mixed precision + Adam (memory.py), a GPT of the shape the model size
suggests (``assumed_shape``: GPT-3's 128-wide heads and hidden ≈ 128 × layers; 1.3B → 24 × 2048,
13B → 40 × 5120, 175B → 96 × 12288, as in Brown et al. 2020 Table 2.1), sequences of 2048 tokens,
a global batch of 1024 sequences (≈ 2M tokens) and 400 TFLOP/s sustained per GPU.

Memory per GPU: memory.py's estimate (1F1B; sequence parallel whenever tp > 1) plus two transient buffers:
with full recompute one layer's activations while it is recomputed, and with ZeRO-3 two gathered layers
(current + prefetched). It must fit ``USABLE_FRACTION`` of the device (the rest: CUDA context, NCCL
buffers, fragmentation). ZeRO-2/3 are used without PP (FSDP), ZeRO-1 (Megatron's distributed optimizer)
with it.

Long sequences (``seq=``, from Python): when no layout fits with whole sequences, the activations are the wall
and the search adds context parallelism, cp ranks per sequence (ring attention: traffic.py's "cp", memory.py's
sequence shard), as strategy "cp"; its replicated gradients are reduced over dp × cp.

Step time: compute = 6Ψ FLOPs per token (8Ψ with full recompute: one more forward; Narayanan et al. 2021
§5.1) over tp·pp GPUs, stretched by the 1F1B bubble to (m + pp − 1)/m; plus tensor- and pipeline-parallel
traffic (on the critical path); plus data-parallel traffic beyond what overlaps with compute. Traffic is
traffic.py's ring model over the link the group spans: NVLink inside a node, ``interconnect`` across.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from partrain_edu.theory import grid
from partrain_edu.theory.batch_limit import max_dp_for_batch
from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory
from partrain_edu.theory.traffic import LINKS, step_traffic
from partrain_edu.units import format_bytes, format_count, parse_size

SEQ, VOCAB, HEAD_DIM = 2048, 51200, 128
GLOBAL_BATCH = 1024             # sequences per optimizer step
FLOPS_PER_GPU = 400e12          # sustained; ≈ 40 % of an H100's 989 TFLOP/s dense bf16 peak
USABLE_FRACTION = 0.9
SIMPLICITY_MARGIN = 1.5         # a simpler family may be up to 1.5x slower than the fastest layout
FAMILIES = ("ddp", "fsdp", "fsdp-tp", "3d", "cp")
# taken, in this order, when it fits, hides its dp traffic and is not much slower: it spares TP's engineering.
# FSDP × TP needs TP already, so it competes on speed with 3d and cp; FAMILIES' order breaks a tie.
SIMPLEST_FIRST = ("ddp", "fsdp")


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int


def assumed_shape(params: int) -> Shape:
    """A GPT-3-like shape of about ``params`` parameters: heads of 128, hidden ≈ 128 × layers (rounded)."""
    heads = max(1, round((128 * params / 12) ** (1 / 3) / HEAD_DIM))  # from Ψ ≈ 12lh² and h = 128·l
    if heads >= 8:
        heads = 8 * round(heads / 8)  # so tensor parallelism up to 8 divides the heads
    hidden = heads * HEAD_DIM
    layers = max(1, round((params - (VOCAB + SEQ + 2) * hidden) / (12 * hidden**2 + 13 * hidden)))
    if layers >= 4:
        # a multiple of 4, so pipelines of 2 and 4 stages split the layers evenly; not of 8, which would turn
        # Megatron's 7.5B (36 × 4096; Narayanan et al. 2021, Table 1) into a 6.7B model of 32 layers
        layers = 4 * round(layers / 4)
    return Shape(layers, hidden, heads)


@dataclass(frozen=True)
class Layout:
    """One way to run the model on the GPUs, with its estimated memory and step time."""

    strategy: str
    dp: int
    tp: int
    pp: int
    zero: int
    micro_batch: int
    microbatches: int
    recompute: str
    bytes_per_device: int
    step_time_s: float
    exposed_comm_s: float
    cp: int = 1              # context-parallel ranks sharing each sequence
    exposed_dp_s: float = 0.0  # the part of exposed_comm_s that is data-parallel traffic not hidden by compute


@dataclass(frozen=True)
class Plan:
    layout: Layout
    reason: str
    shape: Shape
    seq: int = SEQ

    def to_dict(self) -> dict:
        """The ``plan --json`` object ("cp" only when the plan splits the sequence)."""
        lay = self.layout
        return {"strategy": lay.strategy, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "zero": lay.zero,
                "bytes_per_device": lay.bytes_per_device, "reason": self.reason} | ({"cp": lay.cp} if lay.cp > 1 else {})

    def table(self) -> str:
        lay, shape = self.layout, self.shape
        return "\n".join([
            f"strategy {lay.strategy}: dp={lay.dp} tp={lay.tp} pp={lay.pp}" + (f" cp={lay.cp}" if lay.cp > 1 else "")
            + f" zero={lay.zero}",
            f"  {format_bytes(lay.bytes_per_device)} per GPU; micro-batch {lay.micro_batch} x {lay.microbatches}, "
            f"recompute {lay.recompute}; about {lay.step_time_s:.3g} s per step",
            f"  assumed shape: {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, seq {self.seq}",
            f"  why: {self.reason}"])


def link_of(dim: str, sizes: dict[str, int], gpus_per_node: int, interconnect: str) -> str:
    """The link a group along `dim` talks over: NVLink when one node holds the group's whole block of the
    rank grid (`theory.grid`: tp innermost, so a tp group is tp consecutive ranks, a dp group tp·dp)."""
    return "nvlink" if gpus_per_node > 1 and grid.block(dim, sizes) <= gpus_per_node else interconnect


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(limit.bit_length()) if 2**k <= limit]


def candidate_layouts(params: int | str, gpus: int, gpu_memory: int | str, gpus_per_node: int = 8,
                      interconnect: str = "infiniband", global_batch: int = GLOBAL_BATCH, seq: int = SEQ) -> list[Layout]:
    """Every layout of ``gpus`` GPUs that fits ``gpu_memory`` bytes each, with its estimated step time, and no more
    data-parallel replicas than ``global_batch`` has sequences. Context parallelism (cp > 1) is searched only when
    no layout fits without it: when sequences of ``seq`` tokens make the activations the wall, or the batch leaves
    too few replicas for tp and pp to fill the GPUs (its ring sends K and V every layer: not a first choice)."""
    params, gpu_memory = (parse_size(v) if isinstance(v, (str, float)) else v for v in (params, gpu_memory))
    for flag, value in (("--params", params), ("--gpus", gpus), ("--gpu-memory", gpu_memory),
                        ("--gpus-per-node", gpus_per_node), ("global_batch", global_batch), ("--seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{flag} must be a positive whole number, got {value!r}")
    if interconnect not in LINKS:  # "nvlink" between nodes: NVLink-switch systems such as GB200 NVL72
        raise ValueError(f"--interconnect must be one of {', '.join(LINKS)}, got {interconnect!r}")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise ValueError(f"--gpus {gpus} is not a multiple of --gpus-per-node {gpus_per_node}; use whole nodes")
    args = (params, gpus, gpu_memory, gpus_per_node, interconnect, global_batch, seq)
    return _layouts(*args, cps=[1]) or _layouts(*args, cps=[c for c in _powers_of_two(gpus)
                                                            if c > 1 and seq % (2 * c) == 0])


def _layouts(params, gpus, gpu_memory, gpus_per_node, interconnect, global_batch, seq, cps) -> list[Layout]:
    shape = assumed_shape(params)
    layer_params = 12 * shape.hidden**2 + 13 * shape.hidden
    layouts = []
    for tp, cp in ((tp, cp) for tp in _powers_of_two(min(gpus_per_node, gpus)) for cp in cps):
        for pp in [d for d in range(1, shape.layers + 1) if shape.layers % d == 0]:
            # sequence parallelism splits this rank's seq/cp positions over tp: tp must divide them too
            if tp * pp * cp > gpus or gpus % (tp * pp * cp) or shape.heads % tp or (seq // cp) % tp:
                continue
            dp = gpus // (tp * pp * cp)
            if dp > max_dp_for_batch(global_batch):  # a replica without a whole sequence would idle
                continue
            if cp > 1:
                strategy_zeros = [("cp", 0), ("cp", 1)] + ([("cp", 3)] if tp == pp == 1 else [])
            else:
                strategy_zeros = ([("ddp", 0), ("fsdp", 2), ("fsdp", 3)] if tp == pp == 1 else
                                  [("3d", 0), ("3d", 1)] + ([("fsdp-tp", 3)] if pp == 1 else []))  # 2D: ZeRO-3 × tp
            seqs = math.ceil(global_batch / dp)  # sequences per model replica per step
            for (strategy, zero), recompute, b in (
                    (sz, r, b) for sz in strategy_zeros for r in ("none", "selective", "full")
                    for b in _powers_of_two(min(seqs, 64))):
                m = math.ceil(seqs / b)
                mem = estimate_memory(params, dp=dp, tp=tp, pp=pp, zero=zero, layers=shape.layers,
                                      hidden=shape.hidden, heads=shape.heads, seq=seq, micro_batch=b,
                                      recompute=recompute, sequence_parallel=tp > 1, microbatches=m, cp=cp)
                transient = 2 * 2 * layer_params // tp if zero == 3 else 0
                if recompute == "full":
                    transient += activation_bytes_per_layer(seq=seq, micro_batch=b, hidden=shape.hidden,
                                                            heads=shape.heads, tp=tp, sequence_parallel=tp > 1, cp=cp)
                total = mem.total_bytes + transient
                if total > USABLE_FRACTION * gpu_memory:
                    continue
                flops = (8 if recompute == "full" else 6) * params * seqs * seq / (tp * pp * cp)
                compute = flops / FLOPS_PER_GPU * (m + pp - 1) / m
                shape_kw = dict(layers=shape.layers, hidden=shape.hidden, seq=seq, micro_batch=b, microbatches=m)
                sizes = {"pp": pp, "dp": dp, "tp": tp} | ({"cp": cp} if cp > 1 else {})

                def bandwidth(dim: str) -> float:
                    return LINKS[link_of(dim, sizes, gpus_per_node, interconnect)]
                mine = shape_kw | {"seq": seq // cp}   # tp and pp move this rank's s/c positions only
                critical = (step_traffic("tp", tp=tp, pp=pp, **mine).per_rank_bytes_sent / bandwidth("tp")
                            + step_traffic("pp", pp=pp, **mine).per_rank_bytes_sent / bandwidth("pp"))
                if cp > 1:   # the K/V ring, every layer (its overlap with attention is not counted)
                    critical += step_traffic("cp", cp=cp, tp=tp, pp=pp, **shape_kw).per_rank_bytes_sent / bandwidth("cp")
                dp_name = "ddp" if zero == 0 else f"zero{zero}"
                # the replicated gradients are reduced over dp × cp together (Megatron-Core does the same)
                dp_time = (step_traffic(dp_name, params, dp=dp * cp, tp=tp, pp=pp, microbatches=m)
                           .per_rank_bytes_sent / bandwidth("dp"))
                exposed = max(0.0, dp_time - compute)
                layouts.append(Layout(strategy, dp, tp, pp, zero, b, m, recompute, total,
                                      compute + critical + exposed, exposed + critical, cp, exposed))
    return layouts


def plan(params: int | str, gpus: int, gpu_memory: int | str, gpus_per_node: int = 8, interconnect: str = "infiniband",
         global_batch: int = GLOBAL_BATCH, seq: int = SEQ) -> Plan:
    """The ``plan`` subcommand: the simplest family that fits and hides its traffic, else the fastest layout.

    ``global_batch`` (sequences per step, ``--global-batch``) sets the compute that data-parallel traffic can
    hide behind, and caps dp at one replica per sequence: on many GPUs a small batch forces model
    parallelism. ``seq`` (tokens per sequence, ``--seq``) long enough makes the activations the wall: then "cp".
    """
    params, gpu_memory = (parse_size(v) if isinstance(v, (str, float)) else v for v in (params, gpu_memory))
    layouts = candidate_layouts(params, gpus, gpu_memory, gpus_per_node, interconnect, global_batch, seq)
    if not layouts:
        raise ValueError(f"{format_count(params)} parameters fit no layout of {gpus} GPU(s) with "
                         f"{format_bytes(gpu_memory)} each, even with ZeRO-3 and full recompute; use more GPUs "
                         "(--gpus) or bigger ones (--gpu-memory)" + (" or shorter sequences (--seq)" if seq > SEQ else "") + (
                             f", or a global batch of more than {global_batch} sequences (at most one data-parallel "
                             "replica per sequence)" if gpus > max_dp_for_batch(global_batch) else ""))
    best = {f: min((lay for lay in layouts if lay.strategy == f),
                   key=lambda lay: (lay.step_time_s, lay.bytes_per_device), default=None) for f in FAMILIES}
    fastest = min(lay.step_time_s for lay in layouts)
    def acceptable(f: str) -> bool:  # fits, hides its data-parallel traffic, and is not much slower
        lay = best[f]   # (tp's all-reduces are on the critical path of every tp layout: not counted here)
        return lay is not None and lay.exposed_dp_s == 0 and lay.step_time_s <= SIMPLICITY_MARGIN * fastest

    family = next((f for f in SIMPLEST_FIRST if acceptable(f)), None) or min(
        (f for f in FAMILIES if best[f]), key=lambda f: best[f].step_time_s)  # min keeps the first of a tie
    chosen = best[family]

    def rejected(families: tuple[str, ...]) -> str:
        names = {"ddp": "plain DDP", "fsdp": "sharding alone (FSDP)", "fsdp-tp": "FSDP × TP"}
        fitting = [best[f] for f in families if best[f]]
        if not fitting and len(families) == 1:
            return f"{names[families[0]]} does not fit one {format_bytes(gpu_memory)} GPU"
        if not fitting:
            return (f"neither {' nor '.join(names[f] for f in families)} fits {format_bytes(gpu_memory)} GPUs"
                    + (" within that batch" if batch else ""))
        simpler = min(fitting, key=lambda lay: lay.step_time_s)
        ratio = simpler.step_time_s / chosen.step_time_s
        slower = f"{ratio:.1f}x slower" if ratio >= 1.1 else f"{ratio - 1:.0%} slower"   # not "1.0x slower"
        if simpler.exposed_dp_s > 0:
            return f"{names[simpler.strategy]} could not hide its communication behind compute ({slower})"
        return f"{names[simpler.strategy]} would be {slower}"

    states = f"{format_count(params)} parameters need {format_bytes(16 * params)} of mixed-precision Adam states"
    # the global batch feeds at most B replicas (theory.batch_limit): say so where it, not memory, caps dp
    batch = (f"; a global batch of {global_batch:,} sequences feeds at most {max_dp_for_batch(global_batch):,} "
             "data-parallel replicas" if gpus > max_dp_for_batch(global_batch) else "")
    needs = f"needs {format_bytes(chosen.bytes_per_device)} per GPU" + (
        f" with {chosen.recompute} activation recompute" if chosen.recompute != "none" else "")
    if family == "ddp":
        where = "one GPU trains it alone (add GPUs with plain DDP)" if gpus == 1 else \
            f"plain data parallel (DDP) over {gpus} GPUs is enough"
        reason = f"{states}, which fit one {format_bytes(gpu_memory)} GPU with the activations, so {where}: it {needs}."
    elif family == "fsdp-tp":
        hidden = ", its ZeRO-3 collectives hidden behind compute" if chosen.exposed_dp_s == 0 else ""
        reason = (f"{states}{batch}; {rejected(('ddp', 'fsdp'))}, so tensor parallel {chosen.tp} inside a node and "
                  f"ZeRO-3 over {chosen.dp} replicas of {chosen.tp} GPUs (FSDP × TP): it {needs}{hidden}.")
    elif family == "fsdp":
        mode = "FULL_SHARD" if chosen.zero == 3 else "SHARD_GRAD_OP"
        hidden = ", its collectives hidden behind compute" if chosen.exposed_comm_s == 0 else ""
        reason = (f"{states}; {rejected(('ddp',))}, but sharded with ZeRO-{chosen.zero} over "
                  f"{chosen.dp} GPUs (FSDP {mode}) it {needs}{hidden}.")
    else:
        parts = [f"tensor parallel {chosen.tp} inside a node"] if chosen.tp > 1 else []
        if chosen.cp > 1:
            parts.append(f"context parallel {chosen.cp} (ring attention: each GPU holds {seq // chosen.cp:,} of the "
                         f"{seq:,} positions)")
        if chosen.pp > 1:
            parts.append(f"pipeline parallel {chosen.pp} across {'nodes' if gpus > gpus_per_node else 'GPUs'}")
        if chosen.dp > 1:
            parts.append(f"data parallel {chosen.dp} outside (ZeRO-{chosen.zero})")
        two_d = (f"{rejected(('ddp', 'fsdp'))} and {rejected(('fsdp-tp',))}" if best["fsdp-tp"]
                 else rejected(("ddp", "fsdp", "fsdp-tp")))
        wall = (f"; at {seq:,} tokens per sequence no layout fits unless the sequence is split too"
                if family == "cp" else "")
        reason = f"{states}{batch}; {two_d}{wall}, so {', '.join(parts)}: it {needs}."
    return Plan(chosen, reason, assumed_shape(params), seq)
