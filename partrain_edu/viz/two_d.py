"""Why 2D, drawn: FSDP's arithmetic intensity on a fixed cluster and batch as tensor parallelism grows.

One bar per tp: G/tp replicas, each of B·s·tp/G tokens, and the FLOPs per byte one GPU computes and sends along
dp (`theory.batch_limit.fsdp_intensity`); a line is the link's F/β (`hardware_intensity`): dashed at the
datasheet's peak F and β, dotted at the rates the GPU sustains (`calibrated`, from `theory.calibration`) when
given. A bar below the line it is judged by waits on the network; tp moves the GPUs' bytes onto NVLink inside
the node and lifts the bar.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from partrain_edu.theory.batch_limit import fsdp_intensity, hardware_intensity
from partrain_edu.viz.palette import FITS, INK, OVER, clean


def intensity_figure(params: int, gpus: int, global_batch: int, seq: int, flops: float, bandwidth: float,
                     tps: tuple[int, ...] = (1, 2, 4, 8), link: str = "InfiniBand",
                     calibrated: tuple[float, float] | None = None) -> Figure:
    """Bars: FSDP's FLOPs per byte sent along dp for each tp in `tps` (G = `gpus`, B = `global_batch` sequences
    of `seq` tokens); lines: F/β of the link the dp groups cross, at peak (`flops`, `bandwidth`) and, if
    `calibrated` = (F, β) is given, at the sustained rates, which then colour the bars (green: above it)."""
    peak = hardware_intensity(flops, bandwidth)
    lines = [(peak, f"{link} at peak: F/β = {peak:,.0f}", "--")]
    if calibrated is not None:
        sustained = hardware_intensity(*calibrated)
        lines.append((sustained, f"calibrated: F/β = {sustained:,.0f}", ":"))
    need = lines[-1][0]                   # the bars are judged by the realistic line when there is one
    heights = [fsdp_intensity(params, global_batch * seq * tp / gpus, gpus // tp, tp) for tp in tps]
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    bars = ax.bar([str(tp) for tp in tps], heights, color=[FITS if h >= need else OVER for h in heights])
    for bar, tp in zip(bars, tps):
        ax.annotate(f"{gpus // tp} × {global_batch * tp // gpus:g} seq", (bar.get_x() + bar.get_width() / 2,
                    bar.get_height()), ha="center", va="bottom", fontsize=8, color=INK)
    for value, label, style in lines:
        ax.axhline(value, color=INK, linestyle=style, linewidth=1)
        ax.text(-0.4, value, label, va="bottom", ha="left", fontsize=8, color=INK)
    ax.set_xlabel("tensor-parallel degree tp (replicas × sequences each)")
    ax.set_ylabel("FLOPs per byte sent along dp")
    line = "the dotted line" if calibrated is not None else "the line"
    ax.set_title(f"FSDP on {gpus} GPUs, batch of {global_batch} sequences: below {line} it waits on the network",
                 fontsize=9)
    clean(ax)
    fig.tight_layout()
    plt.close(fig)  # out of pyplot's list: shown once, as the cell's value
    return fig
