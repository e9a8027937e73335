"""Replay of a real ring all-reduce: rank × chunk after every step, from the logs the ranks recorded.

    %%torchrun -n 4                               (every rank starts with 2**rank in every element)
    ring_all_reduce(x, log=log)                   # partrain_edu.parallel.ring: one row per step
    ...
    from partrain_edu.viz.ring_replay import ring_replay_figure
    ring_replay_figure([ring[r]["steps"] for r in range(4)], chunk_elems=2)

Rank r starts with 2^r everywhere, so a value's binary digits say which ranks it has summed (15 = 0b1111 = all
four). A cell is shaded by how many ranks its chunk has summed and labelled with them ("013" = ranks 0, 1, 3):
the reduce-scatter completes one diagonal (rank r owns chunk r), the all-gather copies the finished chunks on.
Unlike `viz.ring`, which draws the algorithm from the formulas, this draws what the ranks measured.
"""
from __future__ import annotations

import matplotlib.colors as mcolors
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from partrain_edu.viz.palette import GRADS, IDLE


def ranks_summed(value: float, n: int) -> str:
    """The ranks a value of the 2^r demo has summed, from its binary digits: 11 = 0b1011 → "013"."""
    return "".join(str(k) for k in range(n) if int(value) >> k & 1)


def ring_replay_figure(steps: list[list], chunk_elems: int = 1) -> Figure:
    """One panel for the start and one per step. `steps[r]` is rank r's log: one (phase, sent chunk, received
    chunk, tensor values) per step, the tensor `n × chunk_elems` long. Returns the figure (plt.show() draws it)."""
    n = len(steps)
    cmap = mcolors.LinearSegmentedColormap.from_list("summed", [IDLE, GRADS])
    fig, axes = plt.subplots(1, len(steps[0]) + 1, figsize=(15, 3))
    for i, ax in enumerate(axes):
        tensors = [[2.0 ** r] * n * chunk_elems if i == 0 else steps[r][i - 1][3] for r in range(n)]
        chunks = [[tensors[r][c * chunk_elems] for c in range(n)] for r in range(n)]
        ax.imshow([[bin(int(v)).count("1") for v in row] for row in chunks], cmap=cmap, vmin=1, vmax=n)
        for r in range(n):
            for c in range(n):
                ax.text(c, r, ranks_summed(chunks[r][c], n), ha="center", va="center", fontsize=8)
        phase = "start" if i == 0 else ("RS" if steps[0][i - 1][0] == "reduce-scatter" else "AG")
        ax.set_title(phase if i == 0 else f"{phase} step {(i - 1) % (n - 1) + 1}", fontsize=9)
        ax.set_xticks(range(n), [f"c{c}" for c in range(n)], fontsize=7)
        ax.set_yticks(range(n), [f"rank {r}" for r in range(n)] if i == 0 else [], fontsize=7)
    fig.suptitle(f"Ring all-reduce on {n} ranks: which ranks each chunk has summed "
                 "(RS = reduce-scatter, AG = all-gather)")
    return fig
