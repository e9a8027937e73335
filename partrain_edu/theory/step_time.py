"""How long one training step takes on real GPUs: compute, the pipeline, communication, the optimizer.

    step_time(MODELS["llama3-405b"], Layout(tp=8, pp=16, vpp=8, dp=64, zero=2, global_batch=2048), "h100-sxm")

Per micro-batch and layer on the busiest stage (Narayanan et al. 2021, §3): **compute** — each matrix's FLOPs at peak
× `calibration` η(w), w that product's narrow side on one GPU (`gemms`: QKV and the MLP's first matrices split their
outputs over tp, the projection and the MLP's last their inputs); attention's s×s products causal-halved at the
FlashAttention kernel's measured rate (`Layout.attention`), or unfused all of them at η(head width); elementwise
work moving twice the activation bytes through HBM; an overhead; backward 2×, recompute one forward ("full") or
the attention core ("selective"). **tp**: 2 all-reduces of b·s/c·h bf16 per pass, exposed unless
`tp_comm_overlap` runs them beside the GEMMs; **cp**: all-gathers of K and V, a reduce-scatter of their gradients
(Llama 3); **ep**: 2 all-to-alls per pass; **pp**: the boundary activations, per chunk. The pipeline adds (p−1)/v
busiest micro-batches (1F1B, interleaved) or (p−1)/3 (ZB-H1, Qi et al. 2024). **dp**: gradients reduced (ZeRO:
reduce-scatter + all-gather; FSDP: per micro-batch), hidden behind the last backward (FSDP: each micro-batch;
ZeRO-1/2's gather behind the next forward with `overlap_param_gather`) when the framework overlaps, what hides
still costing a fitted fraction. **Optimizer**: 32 B of HBM traffic per owned parameter. **Links**: every
collective is priced on the nodes its group crosses (`theory.network`: NVLink inside a node, the NICs of the
group's members on each node across), α `traffic.LATENCY`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partrain_edu.theory.calibration import Efficiency, flash_fraction, terms
from partrain_edu.theory.hardware import Device, canonical, device_named
from partrain_edu.theory.layout import Layout, stage_layers
from partrain_edu.theory.layout_memory import activation_bytes_per_token, stage_params
from partrain_edu.theory.model_spec import ModelSpec
from partrain_edu.theory.network import EFFICIENCY, Link, all_to_all_seconds, group_link, group_seconds

OPTIMIZER_BYTES = 32        # fp32 master, two moments and the gradient read; master, moments, bf16 copy written


@dataclass(frozen=True)
class StepTime:
    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)     # seconds per part; they add up to `seconds`
    fsdp_micro_batch_s: float = 0.0     # FSDP's gathers and reduce-scatter of one micro-batch, before hiding


def _group(lay: Layout, axis: str, device: Device) -> tuple[int, int, float | None]:
    """(members, members per node, NIC bytes/s per GPU or None for the device's) of a group along `axis`."""
    members, per_node = lay.span(axis)
    return members, per_node, lay.network_gbps * 1e9 / 8 if lay.network_gbps else None


def axis_link(lay: Layout, axis: str, device: Device, eff: Efficiency | None = None) -> Link:
    """The link a group along `axis` runs its rings on (`theory.network.group_link`, at `eff`'s link shares, by
    default NCCL's measured ones): what every collective of the step is priced on, and what the planner's widget
    draws."""
    members, per_node, nic = _group(lay, axis, device)
    return group_link(device, members, per_node, nic=nic, efficiency=eff.links if eff else EFFICIENCY)


def _collective(op: str, nbytes: float, lay: Layout, axis: str, device: Device, eff: Efficiency) -> float:
    """Seconds of one `op` of `nbytes` along `axis`, priced on the links its group crosses (`theory.network`)."""
    members, per_node, nic = _group(lay, axis, device)
    return group_seconds(op, nbytes, members, per_node, device, nic=nic, efficiency=eff.links)


def _hidden(comm: float, window: float, eff: Efficiency) -> float:
    """What `comm` seconds cost beside `window` seconds of compute they run under: the part that does not fit
    exposed, the part that hides still `overlap_cost` of itself (its kernels take SMs and HBM bandwidth)."""
    hidden = min(comm, window)
    return comm - hidden + eff.overlap_cost * hidden


def gemms(model: ModelSpec, tp: int, moe: bool = False) -> list[tuple[float, float]]:
    """(weights one token multiplies, the product's narrow side) per matrix of one layer on one GPU of a tp group:
    QKV and the MLP's first matrices split their outputs (column-parallel), the projection and the MLP's last their
    inputs (row-parallel, Shoeybi et al. 2019), so their narrow sides are min(h, out/tp) and min(in/tp, h)."""
    h, kv = model.hidden, model.kv_dim
    f = model.expert_width if moe else model.ffn_width
    active = (model.top_k + model.shared_experts) if moe else 1
    up = (2 if model.gated else 1) * active
    mats = [(h * (h + 2 * kv) / tp, min(h, (h + 2 * kv) / tp)), (h * h / tp, h / tp),
            (up * h * f / tp, min(h, f / tp)), (active * f * h / tp, min(f / tp, h))]
    return mats + ([(h * model.experts / tp, min(h, model.experts))] if moe else [])


def layer_times(model: ModelSpec, lay: Layout, device: Device, eff: Efficiency) -> dict[str, float]:
    """One average layer, one micro-batch, one GPU: {"forward", "backward", "recompute", "tp", "cp", "ep"} seconds."""
    tokens = lay.micro_batch * model.seq / lay.cp
    moe = model.n_moe / model.layers
    matmul = sum(share * 2 * tokens * weights / (device.peak_flops * eff.matmul(width))
                 for share, moe_layer in ((1 - moe, False), (moe, True)) if share
                 for weights, width in gemms(model, lay.tp, moe_layer))
    if lay.flash_attention:   # the fused kernel skips the masked half (causal) at its measured rate (Dao 2023)
        rate = device.peak_flops * flash_fraction(device, lay.attention)
        core = 0.5 * tokens * model.attention_core_flops() / lay.tp / rate
    else:                     # batched products over the head width, all s×s computed and then masked
        core = tokens * model.attention_core_flops() / lay.tp / (device.peak_flops * eff.matmul(model.head_dim))
    elementwise = 2 * activation_bytes_per_token(model, lay, "none") * tokens / device.hbm
    forward = matmul + core + elementwise + eff.layer_overhead_s
    recompute = {"none": 0.0, "full": forward, "selective": core,
                 "selective-op": matmul / 2 + elementwise + eff.layer_overhead_s}[lay.recompute]
    passes = {"full": 3, "selective-op": 2.5}.get(lay.recompute, 2)    # the recomputed matmuls' TP collectives
    act = 2 * tokens * model.hidden                        # one bf16 activation of the micro-batch
    tp = 2 * passes * _collective("all_reduce", act, lay, "tp", device, eff)
    if lay.tp_comm_overlap:   # each all-reduce (with SP: gather, scatter) runs beside the GEMM it feeds
        tp = _hidden(tp, matmul * (passes + 1), eff)
    kv = 2 * 2 * lay.micro_batch * model.seq * model.kv_dim / lay.tp    # the whole sequence's K and V
    cp = (_collective("all_gather", kv, lay, "cp", device, eff) * passes
          + _collective("reduce_scatter", kv, lay, "cp", device, eff))
    ep = 0.0
    if model.experts and lay.ep > 1:
        routed = 2 * tokens * model.top_k * model.hidden / lay.tp
        members, per_node, nic = _group(lay, "ep", device)
        ep = moe * 2 * passes * all_to_all_seconds(routed, members, per_node, device, nic=nic,
                                                   efficiency=eff.links)
    return {"forward": forward, "backward": 2 * forward,
            "recompute": recompute, "tp": tp, "cp": cp, "ep": ep}


def stage_times(model: ModelSpec, lay: Layout, device: Device, eff: Efficiency) -> list[dict[str, float]]:
    """Per stage, one micro-batch's seconds by part: the layers', the logits' (last stage), the p2p sends."""
    per_layer = layer_times(model, lay, device, eff)
    tokens = lay.micro_batch * model.seq / lay.cp
    logits_fwd = (2 * tokens * model.hidden * model.vocab / lay.tp
                  / (device.peak_flops * eff.matmul(model.hidden)) + 3 * 4 * tokens * model.vocab / lay.tp / device.hbm)
    boundary = 2 * tokens * model.hidden / (lay.tp if lay.sp else 1)
    p2p = 2 * lay.vpp * _collective("send", boundary, lay, "pp", device, eff)
    stages, priced = [], {}
    for i, n in enumerate(stage_layers(model.layers, lay.pp)):
        last = i == lay.pp - 1
        if (n, last) not in priced:        # stages of equal layers cost the same: price each kind once
            parts = {k: n * v for k, v in per_layer.items()}
            parts["compute"] = parts.pop("forward") + parts.pop("backward") + parts.pop("recompute")
            parts["compute"] += 3 * logits_fwd if last else 0.0
            parts["pp"] = p2p
            priced[n, last] = parts
        stages.append(priced[n, last])
    return stages


def _dp_seconds(model: ModelSpec, lay: Layout, device: Device, eff: Efficiency) -> tuple[float, float, float]:
    """(gradient reduction once per step, weight gather once per step, every micro-batch) seconds of the
    data-parallel collectives of the busiest stage's GPU.
    ZeRO-1 and -2 reduce-scatter the gradients once per step (Llama 3 accumulates them in fp32 over its
    micro-batches, then reduce-scatters: Dubey et al. 2024 §3.3.2); FSDP gathers and reduces every micro-batch."""
    dense, experts = max((stage_params(model, lay, s) for s in {0, lay.pp - 1}), key=sum)
    grad = min(lay.grad_bytes, 4)                # DeepSpeed's bf16 + fp32 pair reduces the fp32 one
    reduce = gather = every = 0.0
    for params, axis in ((dense, "dp"), (experts, "edp")):
        reduce_scatter = _collective("reduce_scatter", grad * params, lay, axis, device, eff)
        all_gather = _collective("all_gather", 2 * params, lay, axis, device, eff)
        if lay.zero == 0:
            reduce += _collective("all_reduce", grad * params, lay, axis, device, eff)
        elif lay.zero in (1, 2):
            reduce, gather = reduce + reduce_scatter, gather + all_gather
        else:  # FSDP: gather forward, gather backward, reduce-scatter — every micro-batch
            every += 2 * all_gather + reduce_scatter
    return reduce, gather, every


def step_time(model: ModelSpec, lay: Layout, device: str, eff: Efficiency | None = None) -> StepTime:
    """The step's seconds and where they go (see the module docstring)."""
    lay.check(model)
    eff = eff or terms(canonical(device))
    hw = device_named(device)
    stages = stage_times(model, lay, hw, eff)
    busiest = max(stages, key=lambda s: sum(s.values()))
    per_mb = sum(busiest.values())
    m = lay.microbatches
    bubble_units = 0.0
    if lay.pp > 1:
        bubble_units = {"1f1b": lay.pp - 1, "interleaved": (lay.pp - 1) / lay.vpp,
                        "zb-h1": (lay.pp - 1) / 3}[lay.pipeline_schedule]
    breakdown = {k: m * v for k, v in busiest.items()}
    breakdown["bubble"] = bubble_units * per_mb
    reduce, gather, every = _dp_seconds(model, lay, hw, eff)
    compute = busiest["compute"] if lay.overlap_dp else 0.0
    # FSDP prefetches its gathers across a micro-batch's forward and backward; gradients reduce during the last
    # micro-batch's backward (2/3 of its compute); ZeRO-1/2's gather hides in the next forward only when asked
    breakdown["dp_exposed"] = (m * _hidden(every, compute, eff) + _hidden(reduce, compute * 2 / 3, eff)
                               + _hidden(gather, compute / 3 if lay.overlap_param_gather else 0.0, eff))
    dense, experts = stage_params(model, lay, 0)
    owned = dense / (lay.dp * lay.cp if lay.zero else 1) + experts / (max(1, lay.dp * lay.cp // lay.ep)
                                                                      if lay.zero else 1)
    breakdown["optimizer"] = OPTIMIZER_BYTES * owned / hw.hbm
    return StepTime(sum(breakdown.values()), breakdown, every)


def layer_forward_seconds(model: ModelSpec, device: str, samples: int, tp: int = 1, cp: int = 1) -> float:
    """One average layer's forward over `samples` sequences on one GPU (its backward: twice; what the emulated
    device charges a block): the same compute term as a step's, communication apart."""
    eff = terms(canonical(device))
    lay = Layout(tp=tp, cp=cp, micro_batch=samples)
    return layer_times(model, lay, device_named(device), eff)["forward"]


def link_cost(device: str, inside_node: bool) -> tuple[float, float]:
    """(α seconds, β bytes/s) of one GPU's own link to a peer of its node (NVLink) or of another (its NIC), at
    the bandwidth NCCL reaches (`theory.network`)."""
    link = group_link(device_named(device), 2, 2 if inside_node else 1)
    return link.alpha, link.beta
