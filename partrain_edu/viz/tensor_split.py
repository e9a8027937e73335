"""Figures of notebook 05 (tensor parallelism): how a matrix is split, and what a layer keeps for backward.

``split_figure()``: column-parallel and row-parallel Y = X·A on two ranks, one colour per rank
(``viz.palette.rank_color``), grey for a tensor every rank holds whole.
``kept_figure(kept, predicted, t)``: the bytes one layer keeps for backward per rank, measured (bars) against
a formula (diamonds).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from partrain_edu.viz.palette import ACTIVATIONS, INK, rank_color

WHOLE = "#9E9E9E"  # a tensor every rank holds whole


def _block(ax, x, y, w, h, color, text):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="white", lw=2))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=11, color="white")


def _sign(ax, x, text):
    ax.text(x, 1.5, text, ha="center", va="center", fontsize=18, color=INK)


def split_figure() -> Figure:
    """Left: X (whole) · [A₀ | A₁] = [Y₀ | Y₁]. Right: [X₀ | X₁] · [A₀ ; A₁] = X₀·A₀ + X₁·A₁."""
    fig, (col, row) = plt.subplots(1, 2, figsize=(13, 3.6))
    _block(col, 0, 0, 2, 3, WHOLE, "X")                                    # (batch, in): whole on both ranks
    _sign(col, 2.4, "·")
    _block(col, 2.8, 0.5, 1, 2, rank_color(0), "A₀")
    _block(col, 3.8, 0.5, 1, 2, rank_color(1), "A₁")
    _sign(col, 5.2, "=")
    _block(col, 5.6, 0, 1, 3, rank_color(0), "Y₀")
    _block(col, 6.6, 0, 1, 3, rank_color(1), "Y₁")
    col.set_title("column-parallel: rank r holds columns A_r of A\nand computes Y_r = X·A_r — no communication",
                  fontsize=10)
    _block(row, 0, 0, 1, 3, rank_color(0), "X₀")
    _block(row, 1, 0, 1, 3, rank_color(1), "X₁")
    _sign(row, 2.4, "·")
    _block(row, 2.8, 1.5, 2, 1, rank_color(0), "A₀")
    _block(row, 2.8, 0.5, 2, 1, rank_color(1), "A₁")
    _sign(row, 5.2, "=")
    _block(row, 5.6, 0, 2, 3, rank_color(0), "X₀·A₀")
    _sign(row, 8.0, "+")
    _block(row, 8.4, 0, 2, 3, rank_color(1), "X₁·A₁")
    row.set_title("row-parallel: rank r holds rows A_r and its features X_r;\n"
                  "the partial products are summed by an all-reduce", fontsize=10)
    for ax in (col, row):
        ax.set_xlim(-0.2, 10.6)
        ax.set_ylim(-0.2, 3.2)
        ax.set_aspect("equal")
        ax.axis("off")
    plt.close(fig)
    return fig


def kept_figure(kept: dict[str, int], predicted: dict[str, int], t: int) -> Figure:
    """Horizontal bars of `kept` (bytes, measured) with `predicted` as diamonds, one row per configuration."""
    fig, ax = plt.subplots(figsize=(8, 2.8))
    names = list(kept)
    ax.barh(names, [kept[n] / 1e3 for n in names], color=ACTIVATIONS, height=0.55,
            label="measured (saved-tensor hooks)")
    ax.plot([predicted[n] / 1e3 for n in names], names, "D", color="black",
            label="Korthikanti et al. (adapted as above)")
    ax.invert_yaxis()
    ax.set_xlabel(f"kB one layer keeps for backward, per rank (t = {t})")
    ax.legend(loc="lower right", fontsize=8, frameon=False)
    plt.close(fig)
    return fig
