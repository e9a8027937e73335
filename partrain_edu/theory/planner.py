"""Which layout for this model on these GPUs? Every layout that fits, priced by the calibrated model; the simplest
good one.

    partrain-edu plan --params 13B --gpus 8 --gpu-memory 80GB --json      # → fsdp, ZeRO-3 over 8
    partrain-edu plan --model llama3-405b --device h100-sxm --gpus 16384 --global-batch 2048

The source notes' decision order (DDP while the states fit one device, then FSDP/ZeRO-3, then TP inside a node +
PP across nodes + DP outside, "only when necessary") as a search: every layout of the GPUs — tp ≤ a node, pp (uneven
stages allowed), interleaving v, cp (each rank keeping ≥ `MIN_CP_POSITIONS` positions), ep for MoE, ZeRO 0–3,
micro-batch, recompute — that fits memory (`layout_memory`) is timed by `estimate` (`step_time` at the device's
fitted efficiency). The answer is the simplest family (`FAMILIES`, simplest first) whose best layout is within
`SIMPLICITY_MARGIN` of the fastest: TP and PP cost engineering, worth it only beyond that. `plan` also returns the
three fastest layouts and, given one, costs it beside them. Without a model (`params` only) the shape is GPT-3's
for that size (`assumed_shape`), on H100s of `gpu_memory`; `interconnect` is the link between nodes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from partrain_edu.theory import grid
from partrain_edu.theory.estimate import Estimate, estimate
from partrain_edu.theory.hardware import canonical, device_named
from partrain_edu.theory.layout import STACK
from partrain_edu.theory.layout import Layout as Spread
from partrain_edu.theory.layout_memory import TIGHT, fullest_stage
from partrain_edu.theory.model_spec import ModelSpec, gpt
from partrain_edu.theory.plan_reason import reason_for
from partrain_edu.theory.traffic import LINKS
from partrain_edu.units import format_bytes, format_count, parse_size

SEQ = 2048
VOCAB = 51200
HEAD_DIM = 128
GLOBAL_BATCH = 1024             # sequences per optimizer step
DEFAULT_DEVICE = "h100-sxm"
SIMPLICITY_MARGIN = 1.10        # a simpler family may be up to 10 % slower than the fastest layout
FAMILIES = ("ddp", "fsdp", "fsdp-tp", "3d", "cp")
PIPELINE_DEGREES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
MICRO_BATCHES = (1, 2, 4, 8)
MIN_CP_POSITIONS = 2048         # below this many positions per rank, splitting a sequence starves the matmuls
NETWORK_GBPS = {"10gbe": 10.0, "1gbe": 1.0}   # per GPU; "infiniband": the device's NIC; "nvlink": its NVLink


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


def assumed_model(params: int, seq: int = SEQ) -> ModelSpec:
    shape = assumed_shape(params)
    return gpt(f"GPT-3-like {format_count(params)}", shape.layers, shape.hidden, shape.heads, VOCAB, seq)


def family(spread: Spread) -> str:
    if spread.cp > 1:
        return "cp"
    if spread.pp > 1 or (spread.tp > 1 and spread.zero < 3):
        return "3d"
    if spread.tp > 1:
        return "fsdp-tp"
    return "fsdp" if spread.zero >= 2 else "ddp"


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
    exposed_comm_s: float       # tp, cp, ep and pp on the critical path + data-parallel traffic not hidden
    cp: int = 1
    exposed_dp_s: float = 0.0
    vpp: int = 1
    ep: int = 1
    estimate: Estimate | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, est: Estimate) -> "Layout":
        s, b = est.layout, est.breakdown
        return cls(family(s), s.dp, s.tp, s.pp, s.zero, s.micro_batch, s.microbatches, s.recompute,
                   round(est.memory.total), est.step_time_s,
                   b["tp"] + b["cp"] + b["ep"] + b["pp"] + b["dp_exposed"], s.cp, b["dp_exposed"], s.vpp, s.ep, est)

    def text(self) -> str:
        extra = "".join(f" {k}={v}" for k, v in (("vpp", self.vpp), ("cp", self.cp), ("ep", self.ep)) if v > 1)
        return f"{self.strategy} dp={self.dp} tp={self.tp} pp={self.pp}{extra} ZeRO-{self.zero}"


@dataclass(frozen=True)
class Plan:
    layout: Layout
    reason: str
    shape: Shape
    seq: int = SEQ
    top: tuple[Layout, ...] = ()
    given: Layout | None = None
    # each family's fastest layout (None: none fits), what the answer was chosen among
    families: dict[str, Layout | None] = field(default_factory=dict, compare=False)

    def to_dict(self) -> dict:
        """The ``plan --json`` object ("cp" only when the plan splits the sequence)."""
        lay = self.layout
        out = {"strategy": lay.strategy, "dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "zero": lay.zero,
               "bytes_per_device": lay.bytes_per_device, "reason": self.reason} | ({"cp": lay.cp} if lay.cp > 1 else {})
        out["best"] = [cand.estimate.to_dict() | {"strategy": cand.strategy} for cand in self.top]
        if self.given:
            out["given"] = self.given.estimate.to_dict() | {"strategy": self.given.strategy}
        return out

    def table(self) -> str:
        lay, shape = self.layout, self.shape
        fastest = self.top[0].step_time_s
        rows = [f"strategy {lay.text()}", f"  {format_bytes(lay.bytes_per_device)} per GPU; micro-batch "
                f"{lay.micro_batch} x {lay.microbatches}, recompute {lay.recompute}; about {lay.step_time_s:.3g} s "
                f"per step, MFU {lay.estimate.mfu:.1%}",
                f"  shape: {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, seq {self.seq}",
                f"  why: {self.reason}", "  the three fastest layouts:"]
        for cand in self.top + ((self.given,) if self.given else ()):
            mark = "given  " if cand is self.given else "       "
            rows.append(f"  {mark}{cand.text():<44} {cand.step_time_s:8.3g} s ({cand.step_time_s / fastest:4.2f}×) "
                        f"MFU {cand.estimate.mfu:5.1%}  {format_bytes(cand.bytes_per_device)}  "
                        f"mb {cand.micro_batch} × {cand.microbatches}, recompute {cand.recompute}")
        return "\n".join(rows)


def link_of(dim: str, sizes: dict[str, int], gpus_per_node: int, interconnect: str) -> str:
    """The link a group along `dim` talks over: NVLink when one node holds the group's whole block of the
    rank grid (`theory.grid`: tp innermost, so a tp group is tp consecutive ranks, a dp group tp·dp)."""
    return "nvlink" if gpus_per_node > 1 and grid.block(dim, sizes) <= gpus_per_node else interconnect


def _powers_of_two(limit: int) -> list[int]:
    return [2**k for k in range(max(0, limit).bit_length()) if 2**k <= limit]


def network_gbps(interconnect: str, device: str) -> float:
    if interconnect not in LINKS:  # "nvlink" between nodes: NVLink-switch systems such as GB200 NVL72
        raise ValueError(f"--interconnect must be one of {', '.join(LINKS)}, got {interconnect!r}")
    if interconnect == "nvlink":
        return device_named(device).nvlink * 8 / 1e9
    return NETWORK_GBPS.get(interconnect, 0.0)


# the recomputation the search tries, least first (per-operator selective checkpointing is torchtitan's: priced by
# `estimate --recompute selective-op`, not searched)
PLANNED_RECOMPUTE = ("none", "selective", "full")


def _spreads(model: ModelSpec, gpus: int, gpus_per_node: int, global_batch: int, net: float,
             stack: Spread | None = None, features: dict | None = None):
    """Every (tp, cp, pp, vpp, ep, dp, zero) of the GPUs, at most one replica per sequence of the batch, with the
    framework's features (`STACK`) of `stack` (default: flash attention, sequence parallel, fp32 gradients) and
    its ZeRO stage only, when given."""
    framework = {"network_gbps": net} | ({k: getattr(stack, k) for k in STACK} if stack else {}) | (features or {})
    cps = [c for c in _powers_of_two(gpus)
           if c == 1 or (model.seq // c >= MIN_CP_POSITIONS and model.seq % (2 * c) == 0)]
    for tp in (t for t in _powers_of_two(min(gpus_per_node, gpus)) if model.heads % t == 0):
        for cp in (c for c in cps if tp * c <= gpus and (model.seq // c) % tp == 0):
            degrees = sorted(set(PIPELINE_DEGREES) | {d for d in range(1, model.layers + 1) if model.layers % d == 0})
            for pp in (p for p in degrees if p <= model.layers and gpus % (tp * cp * p) == 0):
                dp = gpus // (tp * cp * pp)
                if dp > global_batch:                     # a replica without a whole sequence would idle
                    continue
                eps = [1] + [e for e in _powers_of_two(min(model.experts, dp * cp)) if e > 1
                             and model.experts % e == 0 and (dp * cp) % e == 0]
                # two chunks may hold only the embedding and the head (Llama 3): as `Layout.check` allows
                vpps = [1] + [v for v in (2, 4, 8) if pp > 1 and pp * v <= model.layers + 2]
                for ep in eps:
                    for vpp in vpps:
                        zeros = (stack.zero,) if stack else (0, 1, 2, 3) if pp == 1 else (0, 1, 2)
                        for zero in (z for z in zeros if pp == 1 or z < 3):
                            yield Spread(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, zero=zero,
                                         gpus_per_node=gpus_per_node, **framework)


def _resolve(params, seq: int, model: ModelSpec | None, device: str | None, gpu_memory) -> tuple[ModelSpec, str, int]:
    """(the model, the device preset's key, bytes per GPU): `model` or GPT-3's shape of `params`; the device's
    HBM unless `gpu_memory` says otherwise. One-line errors."""
    device = canonical(device or DEFAULT_DEVICE)
    if model is None:
        if params is None:
            raise ValueError("give --params, or a model (--model PRESET or the shape flags)")
        params = parse_size(params) if isinstance(params, (str, float)) else params
        for flag, value in (("--params", params), ("--seq", seq)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} must be a positive whole number, got {value!r}")
        model = assumed_model(params, seq)
    memory = parse_size(gpu_memory) if isinstance(gpu_memory, (str, float)) else gpu_memory
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int) or memory < 1):
        raise ValueError(f"--gpu-memory must be a positive whole number, got {memory!r}")
    return model, device, memory or device_named(device).memory_bytes


def candidate_layouts(params: int | str | None, gpus: int, gpu_memory: int | str | None = None,
                      gpus_per_node: int = 8, interconnect: str = "infiniband", global_batch: int = GLOBAL_BATCH,
                      seq: int = SEQ, *, model: ModelSpec | None = None, device: str | None = None,
                      stack: Spread | None = None, features: dict | None = None) -> list[Layout]:
    """Every layout of ``gpus`` GPUs that fits, each timed; per spread the fastest micro-batch and the least
    recompute that fits it. ``model`` (a ModelSpec) replaces ``params`` (GPT-3's shape of that size); ``stack``
    (a `theory.layout.Layout`: a published run's) lends its framework features (`STACK`), ZeRO stage and recompute,
    so that only the degrees and the micro-batch are searched."""
    model, device, capacity = _resolve(params, seq, model, device, gpu_memory)
    for flag, value in (("--gpus", gpus), ("--gpus-per-node", gpus_per_node), ("--global-batch", global_batch)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{flag} must be a positive whole number, got {value!r}")
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise ValueError(f"--gpus {gpus} is not a multiple of --gpus-per-node {gpus_per_node}; use whole nodes")
    net = network_gbps(interconnect, device)
    layouts = []
    for spread in _spreads(model, gpus, gpus_per_node, global_batch, net, stack, features):
        for b in (b for b in MICRO_BATCHES if b <= math.ceil(global_batch / spread.dp)):
            m = math.ceil(global_batch / (spread.dp * b))
            sized = replace(spread, micro_batch=b, global_batch=spread.dp * b * m)
            options = (stack.recompute,) if stack else PLANNED_RECOMPUTE
            # at most TIGHT of the HBM: real runs need room for the allocator's spikes (`layout_memory.TIGHT`)
            fitting = next((replace(sized, recompute=r) for r in options
                            if fullest_stage(model, replace(sized, recompute=r)).total <= TIGHT * capacity), None)
            if fitting is None:
                break                                     # a bigger micro-batch needs more memory still
            layouts.append(Layout.of(estimate(model, fitting, device, memory_bytes=capacity)))
    return layouts


def plan(params: int | str | None, gpus: int, gpu_memory: int | str | None = None, gpus_per_node: int = 8,
         interconnect: str = "infiniband", global_batch: int = GLOBAL_BATCH, seq: int = SEQ, *,
         model: ModelSpec | None = None, device: str | None = None, given: Spread | None = None,
         stack: Spread | None = None, features: dict | None = None) -> Plan:
    """The ``plan`` subcommand: the simplest family within `SIMPLICITY_MARGIN` of the fastest layout; the three
    fastest; and `given` (a `theory.layout.Layout` of the same GPUs) costed beside them, as it is (its own
    framework features); ``stack`` gives the search the same features."""
    model, device, capacity = _resolve(params, seq, model, device, gpu_memory)
    layouts = candidate_layouts(None, gpus, capacity, gpus_per_node, interconnect, global_batch, model=model,
                                device=device, stack=stack, features=features)
    if not layouts:
        raise ValueError(f"{format_count(model.params())} parameters fit no layout of {gpus} GPU(s) with "
                         f"{format_bytes(capacity)} each, even with ZeRO-3 and full recompute; use more GPUs "
                         "(--gpus) or bigger ones (--gpu-memory)" + (" or shorter sequences (--seq)" if model.seq > SEQ
                                                                     else "")
                         + (f", or a global batch of more than {global_batch} sequences (at most one data-parallel "
                            "replica per sequence)" if gpus > global_batch else ""))
    best = {f: min((lay for lay in layouts if lay.strategy == f), key=lambda lay: (lay.step_time_s,
                   lay.bytes_per_device), default=None) for f in FAMILIES}
    fastest = min(lay.step_time_s for lay in layouts)
    chosen = next(best[f] for f in FAMILIES if best[f] and best[f].step_time_s <= SIMPLICITY_MARGIN * fastest)
    distinct = {}
    for lay in sorted(layouts, key=lambda lay: lay.step_time_s):
        distinct.setdefault((lay.tp, lay.pp, lay.vpp, lay.cp, lay.ep, lay.dp, lay.zero), lay)
    costed = None
    if given is not None:
        if given.gpus != gpus:
            raise ValueError(f"the given layout uses {given.gpus} GPUs (tp·pp·cp·dp), the plan {gpus}: "
                             "give degrees whose product is --gpus")
        given = replace(given, gpus_per_node=gpus_per_node, global_batch=given.global_batch or global_batch,
                        network_gbps=given.network_gbps or network_gbps(interconnect, device))
        costed = Layout.of(estimate(model, given, device, memory_bytes=capacity))
    reason = reason_for(chosen, best, fastest, model, gpus, gpus_per_node, capacity, global_batch)
    shape = Shape(model.layers, model.hidden, model.heads)
    return Plan(chosen, reason, shape, model.seq, tuple(list(distinct.values())[:3]), costed, best)
