"""The rank grid drawn on nodes: which groups stay inside a node and which cross the slow links between nodes.

One panel per rank order (`theory.grid`); a node is a box of `gpus_per_node` consecutive ranks (torchrun
numbers one node's GPUs consecutively). A group's links are drawn in its dimension's colour; a link that
leaves its node is thick.
"""
from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from partrain_edu.theory import grid
from partrain_edu.viz.palette import ACTIVATIONS, GRADS, INK, PARAMS, clean, rank_color

STYLE = {"tp": (PARAMS, "-", "tensor parallel: all-reduce per layer"),
         "dp": (GRADS, ":", "data parallel: all-reduce of gradients"),
         "pp": (ACTIVATIONS, "--", "pipeline: send activations")}
ORDERS = {"Megatron-LM, torchtitan": grid.ORDER, "picotron": ("dp", "pp", "tp")}


def crossing(dim: str, sizes: dict[str, int], order: tuple[str, ...], gpus_per_node: int) -> bool:
    """Does a group along `dim` have members on two nodes?"""
    return any(len({r // gpus_per_node for r in g}) > 1 for g in grid.group_ranks(dim, sizes, order))


def grid_figure(sizes: dict[str, int], gpus_per_node: int, orders: dict[str, tuple] = ORDERS) -> Figure:
    """One panel per order: ranks in node boxes, every group's links; the title says what crosses nodes."""
    world = grid.world_size(sizes)
    nodes = -(-world // gpus_per_node)
    fig, panels = plt.subplots(len(orders), 1, figsize=(1.1 * world + 1.5, 2.6 * len(orders)), squeeze=False)
    for ax, (name, order) in zip(panels[:, 0], orders.items(), strict=True):
        def x(r: int) -> float:
            return r * 1.1 + (r // gpus_per_node) * 0.6     # a gap between nodes
        for n in range(nodes):
            lo = x(n * gpus_per_node) - 0.45
            ax.add_patch(Rectangle((lo, -0.5), (gpus_per_node - 1) * 1.1 + 0.9, 1.0, fill=False, ec="#999999"))
            ax.text(lo + 0.05, 0.6, f"node {n}", fontsize=8, color="#666666")
        for level, dim in enumerate(order):
            color, ls, label = STYLE[dim]
            for members in grid.group_ranks(dim, sizes, order):
                for a, b in itertools.pairwise(members):
                    thick = a // gpus_per_node != b // gpus_per_node
                    ax.annotate("", xy=(x(b), 0), xytext=(x(a), 0), arrowprops=dict(
                        arrowstyle="-", linestyle=ls, color=color, lw=4 if thick else 1.8,
                        connectionstyle=f"arc3,rad={-0.25 - 0.15 * level}"))
            ax.plot([], [], ls, color=color, lw=2, label=label)
        for r in range(world):
            ax.scatter([x(r)], [0], s=420, color=rank_color(r), zorder=3)
            ax.text(x(r), 0, str(r), ha="center", va="center", color="white", fontweight="bold", zorder=4)
        across = [d for d in order if crossing(d, sizes, order, gpus_per_node)] or ["nothing"]
        ax.set_title(f"{name}: {', '.join(order)} (outermost first) — across nodes: {', '.join(across)}",
                     fontsize=10, color=INK)
        ax.set_xlim(-1, x(world - 1) + 1)
        ax.set_ylim(-0.8, 2.2)
        ax.set_xticks([])
        ax.set_yticks([])
        clean(ax, keep=())
    panels[-1, 0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.05), ncol=3, frameon=False, fontsize=8)
    fig.tight_layout()
    plt.close(fig)  # out of pyplot's list: shown once, as the cell's value, not again by the inline backend
    return fig
