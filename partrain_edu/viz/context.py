"""Figure of notebook 10 (context parallelism): who computes which attention scores under a causal mask.

``causal_work_figure(seq_len, n, work)``: for contiguous and zig-zag shards of ``seq_len`` positions over ``n``
ranks, the causal score matrix (queries down, keys across) coloured by the rank that owns each query row (white:
masked, never computed), beside the score entries each rank measured (``work[layout]``, one number per rank).
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

from partrain_edu.viz.palette import INK, clean, rank_color


def _owners(seq_len: int, n: int, zigzag: bool) -> list[int]:
    """The rank that holds each position (the layout of `parallel.context.Sharding`, here without torch)."""
    parts = 2 * n if zigzag else n
    chunk = seq_len // parts
    return [min(p // chunk, parts - 1 - p // chunk) if zigzag else p // chunk for p in range(seq_len)]


def causal_work_figure(seq_len: int, n: int, work: dict[str, list[int]]) -> Figure:
    """Top: the causal mask per layout, one colour per rank; bottom: measured score entries per rank."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 7), gridspec_kw={"height_ratios": [3, 1.4]})
    for col, (name, zigzag) in enumerate([("contiguous", False), ("zig-zag", True)]):
        owner = _owners(seq_len, n, zigzag)
        image = np.ones((seq_len, seq_len, 3))
        for i in range(seq_len):
            image[i, : i + 1] = to_rgb(rank_color(owner[i]))   # query i scores keys 0..i
        mask_ax, bar_ax = axes[0, col], axes[1, col]
        mask_ax.imshow(image, interpolation="nearest")
        mask_ax.set_title(f"{name}: query rows coloured by their rank", fontsize=10)
        mask_ax.set_xlabel("key position")
        mask_ax.set_ylabel("query position")
        counts = work[name]
        bar_ax.bar(range(n), counts, color=[rank_color(r) for r in range(n)])
        for r, c in enumerate(counts):
            bar_ax.text(r, c, f"{c:,}", ha="center", va="bottom", fontsize=9, color=INK)
        bar_ax.set_xticks(range(n), [f"rank {r}" for r in range(n)])
        bar_ax.set_ylim(0, max(max(w) for w in work.values()) * 1.25)
        bar_ax.set_ylabel("scores computed")
        clean(bar_ax)
    fig.tight_layout()
    plt.close(fig)
    return fig
