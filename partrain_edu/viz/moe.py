"""Expert load as bars: rows each expert (or rank) processed, beside the even share and the capacity.

    load_figure({"dropless": [50, 11, 13, 22], "capacity 1.25": [32, 11, 13, 22]}, capacity=32)

The even share is the mean load (theory.moe.imbalance = tallest bar / that line): with expert parallelism
every rank waits at the next all-to-all for the one whose experts got the tallest bar. Numbers are what the
caller measured (notebook 14); this file only draws.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from partrain_edu.theory.moe import imbalance
from partrain_edu.viz.palette import INK, OVER, clean, rank_color


def load_figure(loads: dict[str, list[int]], capacity: int | None = None, unit: str = "expert") -> Figure:
    """One panel per case: a bar per expert (coloured as its rank), the mean as a dashed line, and the
    capacity (rows an expert may take) as a red line when given."""
    fig, axes = plt.subplots(1, len(loads), figsize=(3.2 * len(loads), 2.6), sharey=True, squeeze=False)
    for ax, (label, load) in zip(axes[0], loads.items(), strict=True):
        ax.bar(range(len(load)), load, color=[rank_color(i) for i in range(len(load))])
        mean = sum(load) / len(load)
        ax.axhline(mean, color=INK, linestyle="--", linewidth=1)
        if capacity is not None:
            ax.axhline(capacity, color=OVER, linewidth=1)
        ax.set_title(f"{label}\nimbalance {imbalance(load):.2f}", fontsize=9)
        ax.set_xticks(range(len(load)))
        ax.set_xlabel(unit)
        clean(ax)
    axes[0][0].set_ylabel("rows processed")
    fig.tight_layout()
    plt.close(fig)
    return fig
