"""The three axes of parallelism as one picture: what each device holds under data, tensor and pipeline
parallelism (the comparison table of the source notes, 三个维度 "three dimensions", drawn)."""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from partrain_edu.viz.palette import ACTIVATIONS, PARAMS, rank_color

AXES = [
    ("Data parallel (DP)", "splits the batch",
     "all-reduce of gradients\n≈ parameter bytes per step\nwithin or across nodes"),
    ("Tensor parallel (TP)", "splits each layer's weight matrices",
     "2 all-reduces per layer, forward\nand backward each: very high\nNVLink, inside one node"),
    ("Pipeline parallel (PP)", "splits the layers into stages",
     "send/recv of boundary activations:\nlow\nfine across slow links"),
]


def parallel_axes_figure(devices: int = 4, layers: int = 4) -> Figure:
    """Three panels; in each, a column per device, a row per layer. Coloured = held by that device."""
    if devices < 1 or layers < 1:
        raise ValueError("devices and layers must be positive")
    fig, panels = plt.subplots(1, 3, figsize=(13, 4.6))
    for kind, (ax, (title, splits, traffic)) in enumerate(zip(panels, AXES, strict=True)):
        for d in range(devices):
            x0 = d * 1.25
            for layer in range(layers):
                if kind == 0:  # DP: every device holds every layer, whole
                    cells = [(0.0, 1.0)]
                elif kind == 1:  # TP: every device holds a 1/devices slice of every layer
                    cells = [(d / devices, 1 / devices)]
                else:  # PP: device d holds a contiguous block of layers
                    cells = [(0.0, 1.0)] if layer * devices // layers == d else []
                ax.add_patch(Rectangle((x0, layer), 1.0, 0.85, fill=False, edgecolor="#BBBBBB"))
                for start, width in cells:
                    ax.add_patch(Rectangle((x0 + start, layer), width, 0.85, color=PARAMS, alpha=0.85))
            # the data each device works on: its slice (DP), all of it (TP), micro-batches in turn (PP)
            batch = [f"batch\n{d + 1}/{devices}", "whole\nbatch", "micro-\nbatches"][kind]
            ax.add_patch(Rectangle((x0, -1.1), 1.0, 0.8, color=ACTIVATIONS, alpha=0.35 if kind else 0.8))
            ax.text(x0 + 0.5, -0.7, batch, ha="center", va="center", fontsize=7)
            ax.text(x0 + 0.5, layers + 0.2, f"GPU {d}", ha="center", fontsize=9, color=rank_color(d),
                    fontweight="bold")
        ax.set_xlim(-0.2, devices * 1.25)
        ax.set_ylim(-1.3, layers + 0.7)
        ax.set_title(f"{title}\n{splits}", fontsize=11)
        ax.text(devices * 0.62, -2.1, traffic, ha="center", va="top", fontsize=9)
        ax.set_yticks([i + 0.42 for i in range(layers)], [f"layer {i}" for i in range(layers)], fontsize=8)
        ax.set_xticks([])
        for side in ("top", "right", "bottom", "left"):
            ax.spines[side].set_visible(False)
    fig.suptitle("What each device holds (blue = weights it stores) and what it must send", fontsize=12)
    fig.subplots_adjust(bottom=0.27, top=0.82, wspace=0.3)
    return fig
