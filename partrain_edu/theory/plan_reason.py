"""The planner's one-line reason: what the states need, why each simpler family lost, what the chosen layout does.

    reason_for(chosen, best, fastest, model, gpus, gpus_per_node, capacity, global_batch)   # → one sentence

Words only: every number comes from the layouts `planner.candidate_layouts` priced (`estimate`), so the reason can
never disagree with the search. "Simpler" follows the source notes' order (DDP, FSDP, then model parallelism).
"""
from __future__ import annotations

from partrain_edu.units import format_bytes, format_count

NAMES = {"ddp": "plain DDP", "fsdp": "sharding alone (FSDP)", "fsdp-tp": "FSDP × TP", "3d": "TP + PP + DP",
         "cp": "context parallelism"}
ORDER = ("ddp", "fsdp", "fsdp-tp", "3d", "cp")


def _rejected(family: str, best: dict, chosen, capacity: float, batch_bound: bool) -> str:
    lay = best[family]
    if lay is None:
        return f"{NAMES[family]} " + ("fits no layout of these GPUs within that batch" if batch_bound
                                      else f"does not fit {format_bytes(capacity)} GPUs")
    ratio = lay.step_time_s / chosen.step_time_s
    return f"{NAMES[family]} would be {ratio:.1f}x slower" if ratio >= 1.1 else \
        f"{NAMES[family]} would be {ratio - 1:.0%} slower"


def reason_for(chosen, best: dict, fastest: float, model, gpus: int, gpus_per_node: int, capacity: float,
               global_batch: int) -> str:
    params = model.params()
    states = f"{format_count(params)} parameters need {format_bytes(16 * params)} of mixed-precision Adam states"
    batch = (f"; a global batch of {global_batch:,} sequences feeds at most {global_batch:,} data-parallel replicas"
             if gpus > global_batch else "")
    simpler = [f for f in ORDER[:ORDER.index(chosen.strategy)]]
    why_not = "; ".join(_rejected(f, best, chosen, capacity, gpus > global_batch) for f in simpler)
    needs = f"needs {format_bytes(chosen.bytes_per_device)} per GPU" + (
        f" with {chosen.recompute} activation recompute" if chosen.recompute != "none" else "")
    speed = (" and is the fastest layout" if chosen.step_time_s <= fastest * 1.0001 else
             ", as fast as the fastest to within 0.5 % and simpler" if chosen.step_time_s < fastest * 1.005 else
             f", {chosen.step_time_s / fastest - 1:.0%} slower than the fastest but simpler")
    family = chosen.strategy
    if family == "ddp":
        where = ("one GPU trains it alone" if gpus == 1 else f"plain data parallel (DDP) over {gpus} GPUs"
                 + (" with ZeRO-1" if chosen.zero == 1 else ""))
        if 16 * params < capacity:
            return (f"{states}, which fit one {format_bytes(capacity)} GPU with the activations, so {where}: "
                    f"it {needs}{speed}.")
        return (f"{states}; with Adam's 12 bytes per parameter sharded over the {chosen.dp} GPUs (ZeRO-1) the rest "
                f"fits one {format_bytes(capacity)} GPU, so {where}: it {needs}{speed}.")
    if family == "fsdp":
        mode = "FULL_SHARD" if chosen.zero == 3 else "SHARD_GRAD_OP"
        return (f"{states}; {why_not}, but sharded with ZeRO-{chosen.zero} over {chosen.dp} GPUs (FSDP {mode}) "
                f"it {needs}{speed}.")
    if family == "fsdp-tp":
        return (f"{states}{batch}; {why_not}, so tensor parallel {chosen.tp} inside a node and ZeRO-3 over "
                f"{chosen.dp} replicas of {chosen.tp} GPUs (FSDP × TP): it {needs}{speed}.")
    parts = [f"tensor parallel {chosen.tp} inside a node"] if chosen.tp > 1 else []
    if chosen.cp > 1:
        parts.append(f"context parallel {chosen.cp} (each GPU holds {model.seq // chosen.cp:,} of the "
                     f"{model.seq:,} positions)")
    if chosen.pp > 1:
        where = "across nodes" if gpus > gpus_per_node else "across GPUs"
        parts.append(f"pipeline parallel {chosen.pp} {where}" + (f", {chosen.vpp} chunks each (interleaved)"
                                                                 if chosen.vpp > 1 else ""))
    if chosen.ep > 1:
        parts.append(f"expert parallel {chosen.ep}")
    if chosen.dp > 1:
        parts.append(f"data parallel {chosen.dp} outside (ZeRO-{chosen.zero})")
    return f"{states}{batch}; {why_not}, so {', '.join(parts)}: it {needs}{speed}."
