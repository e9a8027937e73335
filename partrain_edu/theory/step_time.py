"""How long one training step takes on real GPUs: compute, the pipeline, communication, the optimizer.

    step_time(MODELS["llama3-405b"], Layout(tp=8, pp=16, vpp=8, dp=64, zero=2, global_batch=2048), "h100-sxm")

Per micro-batch and layer on the busiest stage (Narayanan et al. 2021, §3): **compute** — matmul FLOPs at peak ×
`calibration` η(h/tp); attention's s×s products causal-halved at FlashAttention-2's rate, or without it all of them at
η(head width); elementwise work moving twice the activation bytes through HBM; an overhead; backward 2×, recompute
one forward ("full") or the attention core ("selective"). **tp**: 2 all-reduces of b·s/c·h bf16 per pass, exposed;
**cp**: all-gathers of K and V, a reduce-scatter of their gradients (Llama 3); **ep**: 2 all-to-alls per pass;
**pp**: the boundary activations, per chunk. The pipeline adds (p−1)/v busiest micro-batches (1F1B, interleaved)
or (p−1)/3 (ZB-H1, Qi et al. 2024). **dp**: gradients reduced (ZeRO: reduce-scatter + all-gather; FSDP: per
micro-batch), hidden behind the last backward (FSDP: each micro-batch) when the framework overlaps, what hides still
costing a fitted fraction. **Optimizer**: 32 B of HBM traffic per owned parameter. Links: NVLink inside a node,
the NIC across (`Layout.block`), α `traffic.LATENCY`, β × fitted link efficiency.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from partrain_edu.theory.calibration import Efficiency, flash_fraction, terms
from partrain_edu.theory.hardware import Device, canonical, device_named
from partrain_edu.theory.layout import Layout, stage_layers
from partrain_edu.theory.layout_memory import activation_bytes_per_token, stage_params
from partrain_edu.theory.model_spec import ModelSpec
from partrain_edu.theory.traffic import LATENCY, collective_time

OPTIMIZER_BYTES = 32        # fp32 master, two moments and the gradient read; master, moments, bf16 copy written


@dataclass(frozen=True)
class StepTime:
    seconds: float
    breakdown: dict[str, float] = field(default_factory=dict)     # seconds per part; they add up to `seconds`


def _link(lay: Layout, axis: str, device: Device, eff: Efficiency) -> tuple[float, float]:
    """(α, β) of the link a group along `axis` crosses: NVLink inside a node, the NIC across."""
    if lay.inside_node(axis) and lay.gpus_per_node > 1:
        return LATENCY["nvlink"], device.nvlink * eff.link
    nic = lay.network_gbps * 1e9 / 8 if lay.network_gbps else device.nic
    return LATENCY["infiniband"], nic * eff.link


def _collective(op: str, nbytes: float, n: int, link: tuple[float, float]) -> float:
    return collective_time(op, int(nbytes), n, alpha=link[0], beta=link[1]) if n > 1 and nbytes else 0.0


def layer_times(model: ModelSpec, lay: Layout, device: Device, eff: Efficiency) -> dict[str, float]:
    """One average layer, one micro-batch, one GPU: {"forward", "backward", "recompute", "tp", "cp", "ep"} seconds."""
    tokens = lay.micro_batch * model.seq / lay.cp
    moe = model.n_moe / model.layers
    weights = (1 - moe) * model.layer_matmul_weights() + moe * model.layer_matmul_weights(moe=True)
    matmul = 2 * tokens * weights / lay.tp / (device.peak_flops * eff.matmul(model.hidden / lay.tp))
    if lay.flash_attention:   # the fused kernel skips the masked half (causal) at its measured rate (Dao 2023)
        core = 0.5 * tokens * model.attention_core_flops() / lay.tp / (device.peak_flops * flash_fraction(device))
    else:                     # batched products over the head width, all s×s computed and then masked
        core = tokens * model.attention_core_flops() / lay.tp / (device.peak_flops * eff.matmul(model.head_dim))
    elementwise = 2 * activation_bytes_per_token(model, lay, "none") * tokens / device.hbm
    forward = matmul + core + elementwise + eff.layer_overhead_s
    recompute = {"none": 0.0, "full": forward, "selective": core}[lay.recompute]
    passes = 3 if lay.recompute == "full" else 2
    act = 2 * tokens * model.hidden                        # one bf16 activation of the micro-batch
    tp = 2 * passes * _collective("all_reduce", act, lay.tp, _link(lay, "tp", device, eff))
    kv = 2 * 2 * lay.micro_batch * model.seq * model.kv_dim / lay.tp    # the whole sequence's K and V
    cp_link = _link(lay, "cp", device, eff)
    cp = (_collective("all_gather", kv, lay.cp, cp_link) * (passes)
          + _collective("reduce_scatter", kv, lay.cp, cp_link))
    ep = 0.0
    if model.experts and lay.ep > 1:
        routed = 2 * tokens * model.top_k * model.hidden / lay.tp
        alpha, beta = _link(lay, "ep", device, eff)
        ep = moe * 2 * passes * ((lay.ep - 1) * alpha + routed * (lay.ep - 1) / lay.ep / beta)
    return {"forward": forward, "backward": 2 * (forward - eff.layer_overhead_s) + 2 * eff.layer_overhead_s,
            "recompute": recompute, "tp": tp, "cp": cp, "ep": ep}


def stage_times(model: ModelSpec, lay: Layout, device: Device, eff: Efficiency) -> list[dict[str, float]]:
    """Per stage, one micro-batch's seconds by part: the layers', the logits' (last stage), the p2p sends."""
    per_layer = layer_times(model, lay, device, eff)
    tokens = lay.micro_batch * model.seq / lay.cp
    logits_fwd = (2 * tokens * model.hidden * model.vocab / lay.tp
                  / (device.peak_flops * eff.matmul(model.hidden)) + 3 * 4 * tokens * model.vocab / lay.tp / device.hbm)
    boundary = 2 * tokens * model.hidden / (lay.tp if lay.sp else 1)
    alpha, beta = _link(lay, "pp", device, eff)
    p2p = 2 * lay.vpp * (alpha + boundary / beta) if lay.pp > 1 else 0.0
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


def _dp_seconds(model: ModelSpec, lay: Layout, device: Device, eff: Efficiency) -> tuple[float, float]:
    """(once per step, every micro-batch) seconds of the data-parallel collectives of the busiest stage's GPU.
    ZeRO-1 and -2 reduce-scatter the gradients once per step (Llama 3 accumulates them in fp32 over its
    micro-batches, then reduce-scatters: Dubey et al. 2024 §3.3.2); FSDP gathers and reduces every micro-batch."""
    dense, experts = max((stage_params(model, lay, s) for s in {0, lay.pp - 1}), key=sum)
    link = _link(lay, "dp", device, eff)
    group, expert_group = lay.dp * lay.cp, max(1, lay.dp * lay.cp // lay.ep)
    grad = min(lay.grad_bytes, 4)                # DeepSpeed's bf16 + fp32 pair reduces the fp32 one
    once = every = 0.0
    for params, n in ((dense, group), (experts, expert_group)):
        reduce_scatter = _collective("reduce_scatter", grad * params, n, link)
        gather = _collective("all_gather", 2 * params, n, link)
        if lay.zero == 0:
            once += _collective("all_reduce", grad * params, n, link)
        elif lay.zero in (1, 2):
            once += reduce_scatter + gather
        else:  # FSDP: gather forward, gather backward, reduce-scatter — every micro-batch
            every += 2 * gather + reduce_scatter
    return once, every


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
    once, every = _dp_seconds(model, lay, hw, eff)

    def exposed(comm: float, window: float) -> float:
        """What does not hide behind `window` seconds of compute; what hides still costs `overlap_cost` of itself
        (its kernels take SMs and HBM bandwidth from the compute beside it)."""
        hidden = min(comm, window) if lay.overlap_dp else 0.0
        return comm - hidden + eff.overlap_cost * hidden
    # FSDP prefetches its gathers across a micro-batch's forward and backward; gradients reduce during backward
    breakdown["dp_exposed"] = (m * exposed(every, busiest["compute"] * (1 if lay.zero == 3 else 2 / 3))
                               + exposed(once, busiest["compute"] * 2 / 3))
    dense, experts = stage_params(model, lay, 0)
    owned = dense / (lay.dp * lay.cp if lay.zero else 1) + experts / (max(1, lay.dp * lay.cp // lay.ep)
                                                                      if lay.zero else 1)
    breakdown["optimizer"] = OPTIMIZER_BYTES * owned / hw.hbm
    return StepTime(sum(breakdown.values()), breakdown)


def layer_forward_seconds(model: ModelSpec, device: str, samples: int, tp: int = 1, cp: int = 1) -> float:
    """One average layer's forward over `samples` sequences on one GPU (its backward: twice; what the emulated
    device charges a block): the same compute term as a step's, communication apart."""
    eff = terms(canonical(device))
    lay = Layout(tp=tp, cp=cp, micro_batch=samples)
    return layer_times(model, lay, device_named(device), eff)["forward"]


def link_cost(device: str, inside_node: bool) -> tuple[float, float]:
    """(α seconds, β bytes/s) of a GPU's link to a peer of its node (NVLink) or of another (the NIC), β at the
    fitted link efficiency."""
    lay = Layout(tp=2, gpus_per_node=2 if inside_node else 1)
    return _link(lay, "tp", device_named(device), terms(canonical(device)))
