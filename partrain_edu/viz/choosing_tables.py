"""Printed tables for notebook 08 (choosing a strategy): the planner beside the source notes' rules of thumb,
and strategies timed on the emulated device with their model FLOPs utilisation (MFU).

    from partrain_edu.viz.choosing_tables import family_table, layout_text, rules_vs_planner, mfu_table
    seed_against_planner({"13B": "FSDP", "175B": "TP+PP+DP"}, 64)         # the notes' answer beside the planner
    rules_vs_planner(notes_rules, [("1.3B", 8), ("13B", 64)])   # notes_rules(size, gpus) -> (by layers, by GPUs)
    family_table("175B", 1024)                                   # the fastest layout of each family, and the pick
    mfu_table({"ddp": launch(TrainConfig(strategy="ddp", nproc=4, steps=3, device="emulated:h100"))})

Everything printed comes from ``theory.planner.plan`` and from the reports of ``train.launch``; nothing here
decides anything, it only lays the numbers out in columns.
"""
from __future__ import annotations

from typing import Callable

from partrain_edu.theory.planner import (
    FAMILIES,
    GLOBAL_BATCH,
    MIN_CP_POSITIONS,
    SEQ,
    SIMPLICITY_MARGIN,
    Layout,
    assumed_shape,
    plan,
)
from partrain_edu.units import parse_size


def layout_text(lay: Layout) -> str:
    """'3d dp=32 tp=4 pp=8 vpp=8 ZeRO-2': a layout in one column (`Layout.text`: vpp, cp, ep when > 1)."""
    return lay.text()


def rules_vs_planner(notes_rules: Callable[[str, int], tuple[str, str]], cases: list[tuple[str, int]],
                     gpu_memory: str = "80GB") -> None:
    """One row per (model size, GPUs): the notes' answers (by layers: PP or TP; by GPUs: hybrid or simple), the
    planner's layout, and the sequences each model replica gets per step (the notes: keep ≥ 8 per device)."""
    print(f"{'model':>5} {'GPUs':>4} {'layers':>6} | {'by layers':>10} {'by GPUs':>8} | {'planner':<31} "
          f"{'seqs/replica':>12} {'micro-batch':>11}")
    for size, gpus in cases:
        by_layers, by_gpus = notes_rules(size, gpus)
        lay = plan(size, gpus=gpus, gpu_memory=gpu_memory).layout
        layers = assumed_shape(parse_size(size)).layers
        print(f"{size:>5} {gpus:>4} {layers:>6} | {by_layers:>10} {by_gpus:>8} | {layout_text(lay):<31} "
              f"{GLOBAL_BATCH // lay.dp:>12} {lay.micro_batch:>11}")


def mfu_table(reports: dict[str, dict]) -> None:
    """One row per emulated run: ranks, compute and step time per step (emulated ms), MFU, and what the rest
    of the step went to — a pipeline's measured bubble beside its formula, or communication that did not hide."""
    print(f"{'strategy':<9} {'ranks':>5} {'compute':>10} {'step':>10} {'MFU':>5}   the rest of the step")
    for name, report in reports.items():
        em, steps = report["emulated"], len(report["losses"])
        compute, step = em["compute_s"] / steps, report["step_time_s"]
        if "bubble" in em:
            rest = f"bubble {em['bubble']['measured']:.3f} (formula {em['bubble']['formula_text']} = " \
                   f"{em['bubble']['formula']:.3f})"
        else:
            rest = f"communication not hidden: {(step - compute) * 1e3:.1f} ms" if step > compute * 1.001 else "—"
        print(f"{name:<9} {report['world_size']:>5} {compute * 1e3:>7.1f} ms {step * 1e3:>7.1f} ms "
              f"{em['mfu']:>5.2f}   {rest}")


def fsdp_against_choice(size: str, gpus_list: list[int], gpu_memory: str = "80GB") -> None:
    """For each GPU count: the planner's layout, the sequences each of its replicas computes per step and its
    step time, beside the fastest FSDP layout that fits: its split of a GPU's sequences into micro-batches, the
    data-parallel traffic it could not hide, and its step time (the planner's estimates, in seconds)."""
    print(f"{'GPUs':>5}  {'planner':<31} {'seqs/replica':>12} {'step':>7} | {'best FSDP':>9}: "
          f"{'micro-batch':>11} {'recompute':>9} {'not hidden':>10} {'step':>7}")
    for gpus in gpus_list:
        p = plan(size, gpus=gpus, gpu_memory=gpu_memory)
        chosen, fsdp = p.layout, p.families["fsdp"]
        split = f"{fsdp.micro_batch} × {fsdp.microbatches}"
        print(f"{gpus:>5}  {layout_text(chosen):<31} {GLOBAL_BATCH // chosen.dp:>12} {chosen.step_time_s:>5.1f} s | "
              f"{'':>9}  {split:>11} {fsdp.recompute:>9} {fsdp.exposed_dp_s:>8.1f} s {fsdp.step_time_s:>5.1f} s")


def family_table(size: str, gpus: int, gpu_memory: str = "80GB", seq: int = SEQ) -> None:
    """The fastest layout of each family (`planner.FAMILIES`, simplest first) with its step time against the
    fastest layout of all and the communication left on its critical path; "←" marks the planner's pick, the
    first family within `SIMPLICITY_MARGIN` of the fastest (the planner's estimates, in seconds)."""
    p = plan(size, gpus, gpu_memory, seq=seq)
    fastest, chosen = p.top[0].step_time_s, p.layout
    print(f"{size} on {gpus} GPUs; the planner takes the simplest family within {SIMPLICITY_MARGIN:.2f}× the fastest")
    print(f"{'family':<8} {'its fastest layout':<34} {'micro-batch':>11} {'recompute':>9} {'step':>8} "
          f"{'× fastest':>9} {'comm. exposed':>13}")
    for name in FAMILIES:
        lay = p.families[name]
        if lay is None:
            print(f"{name:<8} " + (f"none searched: split in two, {seq} positions leave {seq // 2} per rank, "
                                   f"under {MIN_CP_POSITIONS}" if name == "cp" and seq // 2 < MIN_CP_POSITIONS
                                   else "no layout fits"))
            continue
        split = f"{lay.micro_batch} × {lay.microbatches}"
        print(f"{name:<8} {lay.text():<34} {split:>11} {lay.recompute:>9} {lay.step_time_s:>6.2f} s "
              f"{lay.step_time_s / fastest:>8.2f}× {lay.exposed_comm_s:>11.2f} s" + ("  ←" if lay == chosen else ""))


def seed_against_planner(seed: dict[str, str], gpus: int, gpu_memory: str = "80GB") -> None:
    """One row per model size: the notes' answer (`seed`: size → family), the planner's pick and its share of the
    GPU's memory, and the fastest FSDP, FSDP × TP and 3D layouts' step times against the fastest layout of all
    (the planner's estimates, at most `layout_memory.TIGHT` of the memory; "—" where a family has no layout that
    fits)."""
    print(f"{'model':>5}  {'the notes':<9} {'planner':<31} {'memory':>6} {'fastest':>8} | × fastest:"
          f" {'ddp':>5} {'fsdp':>5} {'fsdp-tp':>7} {'3d':>5}")
    for size, answer in seed.items():
        p = plan(size, gpus, gpu_memory)
        chosen, fastest = p.layout, p.top[0].step_time_s
        cols = [f"{p.families[f].step_time_s / fastest:.2f}" if p.families[f] else "—"
                for f in ("ddp", "fsdp", "fsdp-tp", "3d")]
        print(f"{size:>5}  {answer:<9} {layout_text(chosen):<31} {chosen.estimate.memory_fraction:>6.0%} "
              f"{fastest:>6.2f} s | {'':>10} {cols[0]:>5} {cols[1]:>5} {cols[2]:>7} {cols[3]:>5}")
