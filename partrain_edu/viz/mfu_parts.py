"""MFU in two factors, for runs on the emulated device (notebook 15): the kernels' fraction of peak × the busy part.

    mfu_parts_table({"ddp": (cfg, launch(cfg))})     # cfg: the run's TrainConfig on an emulated device

MFU = kernels × busy. **kernels**: what the charged layers reach of the device's peak — their FLOPs at peak over
their calibrated seconds (`theory.step_time.layer_forward_seconds`, what the emulated device charges a block:
each matmul at η of its narrow side, `theory.step_time.gemms`, attention at FlashAttention-2's rate, the
elementwise work at HBM speed, a per-layer overhead). **busy**: the charged compute
over the step (1 when nothing waits); the rest went to communication that did not hide, or to a pipeline's
bubble. Each run's kernels are also predicted from its micro-batch and split, before looking at the run.
"""
from __future__ import annotations

from partrain_edu.strategies import get_strategy
from partrain_edu.theory.hardware import canonical, device_named
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.step_time import layer_forward_seconds

XL = MODELS["gpt-1.3b"]   # the shape the emulated device charges (strategies.emulation)


def predicted_kernels(cfg) -> float:
    """One GPT-3 XL layer's forward FLOPs on one rank (its micro-batch, 1/tp of the heads, 1/cp of the positions)
    at the device's peak, over the seconds the calibrated model gives it."""
    dp, tp, _ = get_strategy(cfg.strategy).layout(cfg)
    cp = (cfg.cp or cfg.nproc) if cfg.strategy == "cp" else 1
    samples = cfg.global_batch // (dp * cfg.microbatches)
    per_token = XL.forward_flops_per_token()
    flops = (per_token["dense"] + per_token["attention"]) / XL.layers * samples * XL.seq / (tp * cp)
    name = canonical(cfg.device.split(":")[1].split(",")[0])
    return flops / device_named(name).peak_flops / layer_forward_seconds(XL, name, samples, tp=tp, cp=cp)


def mfu_parts_table(runs: dict) -> None:
    """One row per run {name: (cfg, report)}: ranks, emulated step, MFU = kernels × busy (kernels measured and
    predicted), and what the step's idle part went to."""
    print(f"{'run':<16}{'ranks':>5}{'step':>10}{'MFU':>7} ={'kernels':>8} ×{'busy':>6}   {'predicted kernels':<18}"
          f"the rest of the step")
    for name, (cfg, report) in runs.items():
        em, step = report["emulated"], report["step_time_s"]
        busy = em["compute_s"] / len(report["losses"]) / step
        rest = (f"bubble {em['bubble']['measured']:.3f}" if "bubble" in em
                else f"communication not hidden {(1 - busy) * step * 1e3:.1f} ms" if busy < 0.999 else "—")
        print(f"{name:<16}{report['world_size']:>5}{step * 1e3:>7.1f} ms{em['mfu']:>7.3f} ={em['mfu'] / busy:>8.3f} ×"
              f"{busy:>6.3f}   {predicted_kernels(cfg):<18.3f}{rest}")
