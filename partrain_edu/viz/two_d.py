"""Why 2D, drawn: FSDP's arithmetic intensity on a fixed cluster and batch as tensor parallelism grows, each bar
against the F/β of the dp group it actually has.

One bar per tp: G/tp replicas, each of B·s·tp/G tokens, and the FLOPs per byte one GPU computes and sends along
dp (`theory.batch_limit.fsdp_intensity`). Over each bar, a tick is that tp's F/β (`hardware_intensity`), β what the
dp group's ring gives each member (`theory.network.group_link`): k = node/tp members per node cross the network on
k NICs, so β shrinks as tp grows. Dashed at the GPU's peak F, dotted at a sustained F when given. tp lifts a bar
and its tick alike (the node's egress is the same): a bar's verdict does not change with tp.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from partrain_edu.theory.batch_limit import dp_bandwidth, fsdp_intensity, hardware_intensity
from partrain_edu.theory.hardware import device_named
from partrain_edu.viz.palette import FITS, INK, OVER, clean


def dp_thresholds(device, gpus: int, tp: int, gpus_per_node: int = 8, flops: float | None = None) -> float:
    """F/β for FSDP's dp group of a G-GPU grid with tp inside each node (`batch_limit.dp_bandwidth`)."""
    device = device_named(device) if isinstance(device, str) else device
    beta = dp_bandwidth(device, tp, gpus_per_node, gpus)
    return hardware_intensity(device.peak_flops if flops is None else flops, beta)


def intensity_figure(params: int, gpus: int, global_batch: int, seq: int, device,
                     tps: tuple[int, ...] = (1, 2, 4, 8), gpus_per_node: int = 8,
                     sustained: float | None = None) -> Figure:
    """Bars: FSDP's FLOPs per byte sent along dp for each tp in `tps` (G = `gpus` GPUs of `device`, a
    `hardware.Device` or its name, B = `global_batch` sequences of `seq` tokens); ticks: each tp's F/β
    (`dp_thresholds`), at peak and, if `sustained` FLOP/s is given, at that rate, which then colours the bars
    (green: at or above its tick)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.2))
    for x, tp in enumerate(tps):
        height = fsdp_intensity(params, global_batch * seq * tp / gpus, gpus // tp, tp)
        ticks = [(dp_thresholds(device, gpus, tp, gpus_per_node), "--")]
        if sustained is not None:
            ticks.append((dp_thresholds(device, gpus, tp, gpus_per_node, sustained), ":"))
        bar = ax.bar(x, height, color=FITS if height >= ticks[-1][0] else OVER, width=0.6)[0]
        for value, style in ticks:
            ax.plot([x - 0.4, x + 0.4], [value, value], color=INK, linestyle=style, linewidth=1.2)
        ax.annotate(f"{gpus // tp} × {global_batch * tp // gpus:g} seq", (x, bar.get_height()), ha="center",
                    va="bottom", fontsize=8, color=INK)
    ax.set_xticks(range(len(tps)), [str(tp) for tp in tps])
    ax.set_xlabel("tensor-parallel degree tp (replicas × sequences each)")
    ax.set_ylabel("FLOPs per byte sent along dp")
    lines = "-- peak" + (", ·· sustained" if sustained is not None else "")
    ax.set_title(f"FSDP on {gpus} GPUs, batch of {global_batch} sequences; ticks: its dp group's F/β ({lines})",
                 fontsize=9)
    clean(ax)
    fig.tight_layout()
    plt.close(fig)  # out of pyplot's list: shown once, as the cell's value
    return fig
