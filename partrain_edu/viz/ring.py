"""One collective, step by step: which rank sends which chunk to whom, and what every buffer holds after.

    from partrain_edu.viz.ring import collective_figure
    collective_figure("all_reduce", 4, step=3, payload_bytes=10**9)

Left: a row per rank, a column per chunk of the S-byte buffer (S/n each). A chunk is drawn in the colours of
the ranks whose data it holds, so a reduction shows as colours adding up until a chunk holds all n; arrows are
this step's transfers (``theory.ring_steps``: the ring algorithms of Patarasuk & Yuan 2009, as NCCL runs
them). Right: what one rank sends in the whole collective as a multiple of S, against n — 2(n−1)/n for
all-reduce, (n−1)/n for reduce-scatter, all-gather and all-to-all, 1 for broadcast — which is also the "bus
bandwidth" factor nccl-tests multiply the measured algorithm bandwidth by (busbw = algbw × factor).
"""

from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, Rectangle
from matplotlib.patheffects import withStroke

from partrain_edu.theory.ring_steps import RING_OPS, bytes_sent_per_rank, ring_steps, states
from partrain_edu.units import format_bytes
from partrain_edu.viz.palette import INK, clean, rank_color

OP_NAMES = {"all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter", "all_gather": "all-gather",
            "broadcast": "broadcast", "all_to_all": "all-to-all"}
FACTORS = {"all_reduce": ("2(n−1)/n", lambda n: 2 * (n - 1) / n), "reduce_scatter": ("(n−1)/n", lambda n: (n - 1) / n),
           "all_gather": ("(n−1)/n", lambda n: (n - 1) / n), "broadcast": ("1", lambda n: 1.0 if n > 1 else 0.0),
           "all_to_all": ("(n−1)/n", lambda n: (n - 1) / n)}
DONE = {"all_reduce": "every rank holds the sum of all n buffers",
        "reduce_scatter": "rank i holds chunk i, summed over all ranks",
        "all_gather": "every rank holds every rank's chunk",
        "broadcast": "every rank holds the root's buffer",
        "all_to_all": "rank i holds, in slot j, the part rank j meant for it"}
START = {"all_reduce": "each rank holds its own full buffer (to be summed)",
         "reduce_scatter": "each rank holds its own full buffer (to be summed)",
         "all_gather": "rank i holds only its own chunk i", "broadcast": "only rank 0 (the root) holds data",
         "all_to_all": "each rank holds its own part for itself; slot j will receive rank j's part"}


def _describe(op: str, n: int, step: int, total: int) -> str:
    if step == 0:
        return f"before the first step: {START[op]}"
    phase = ""
    if op == "all_reduce":
        phase = " (reduce-scatter phase)" if step <= n - 1 else " (all-gather phase)"
    transfers = ring_steps(op, n)[step - 1]
    if op == "all_to_all":
        what = f"each rank sends rank i+{step} the chunk meant for it"
    elif op == "broadcast":
        what = "each rank that has a new chunk forwards it to its right neighbour (pipelined)"
    else:
        what = "each rank sends one chunk to its right neighbour, which " + (
            "adds it to its own" if transfers[0].reduce else "stores it")
    done = f" — done: {DONE[op]}" if step == total else ""
    return f"step {step} of {total}{phase}: {what}{done}"


def collective_figure(op: str, n: int, step: int = 0, payload_bytes: int = 10**9,
                      measured: dict[int, int] | None = None) -> Figure:
    """The buffers after ``step`` of ``op`` over ``n`` ranks (0 = before it starts) and the bytes-vs-n curve.

    ``measured``: {world size: bytes one rank sent for one call} (e.g. from ``CommTracer``) drawn on the curve.
    """
    check_step(op, n, step)
    fig = collective_frame(op, n, payload_bytes, measured)
    collective_data(fig, op, n, step, payload_bytes)
    return fig


def check_step(op: str, n: int, step: int) -> None:
    if op not in RING_OPS:
        raise ValueError(f"collective must be one of {', '.join(RING_OPS)}, got {op!r}")
    if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 32:
        raise ValueError(f"world size must be a whole number from 2 to 32, got {n!r}")
    steps = len(ring_steps(op, n))
    if not 0 <= step <= steps:
        raise ValueError(f"step must be between 0 and {steps} for {OP_NAMES[op]} over {n} ranks")


def collective_frame(op: str, n: int, payload_bytes: int, measured: dict[int, int] | None = None) -> Figure:
    """What stays while the collective steps: rank and chunk labels, the title, and the whole bytes-vs-n curve."""
    fig, (ax, curve) = plt.subplots(1, 2, figsize=(12, 4.9), gridspec_kw={"width_ratios": [1.55, 1], "wspace": 0.18})
    fig.subplots_adjust(left=0.02, right=0.97, top=0.8, bottom=0.13)
    for r in range(n):
        ax.text(-0.15, r, f"rank {r}", ha="right", va="center", fontsize=9 if n <= 8 else 7, color=rank_color(r),
                fontweight="bold")
    if n <= 12:
        for c in range(n):
            ax.text(c + 0.5, -0.62, f"chunk {c}" if n <= 6 else str(c), ha="center", va="bottom", fontsize=8, color=INK)
    ax.text(n / 2, n - 0.4, "a chunk shows the colours of the ranks whose data it holds",
            ha="center", va="top", fontsize=8.5, color="#666666")
    ax.set_xlim(-1.3, n + 0.1)
    ax.set_ylim(n - 0.1, -0.9)
    ax.set_axis_off()
    ax.set_title(f"{OP_NAMES[op]} over {n} ranks: chunks of S/n = {format_bytes(payload_bytes / n)}", fontsize=11)

    # what one rank sends, as a multiple of S, against n
    label, factor = FACTORS[op]
    ns = list(range(2, 33))
    curve.plot(ns, [factor(k) for k in ns], color=INK, lw=1.8, label=f"ring: {label} · S")
    per_rank = max(bytes_sent_per_rank(op, n, payload_bytes))
    curve.plot([n], [per_rank / payload_bytes], "o", color=rank_color(0), ms=9, zorder=5)
    curve.annotate(f"n = {n}: {label} = {per_rank / payload_bytes:.3g}\n→ {format_bytes(per_rank)} per rank",
                   (n, per_rank / payload_bytes), xytext=(12, -34), textcoords="offset points", fontsize=9,
                   arrowprops={"arrowstyle": "-", "color": "#999999"})
    if measured:
        sizes = sorted(measured)
        curve.plot(sizes, [measured[k] / payload_bytes for k in sizes], "x", color="black", ms=9, mew=2,
                   label="measured (CommTracer)")
    asymptote = 2.0 if op == "all_reduce" else 1.0
    curve.axhline(asymptote, color="#999999", ls=":", lw=1)
    curve.set_ylim(0, asymptote * 1.25)
    curve.set_xlim(1, 33)
    curve.set_xlabel("ranks n")
    curve.set_ylabel("bytes each rank sends ÷ S")
    curve.set_title(f"bus bandwidth = algorithm bandwidth × {label}", fontsize=10)
    curve.legend(loc="lower right", fontsize=8, frameon=False)
    clean(curve)
    return fig


def collective_data(fig: Figure, op: str, n: int, step: int, payload_bytes: int) -> list:
    """What changes with the step: the buffers, this step's transfers and the sentence above; returns them."""
    ax, steps = fig.axes[0], ring_steps(op, n)
    # cell (rank r, chunk c) split into n stripes, stripe j coloured if it holds rank j's data
    stripes, colors = [], []
    for r, row in enumerate(states(op, n)[step]):
        for c, holds in enumerate(row):
            for j in range(n):
                x0 = c + 0.05 + 0.9 * j / n
                stripes.append([(x0, r - 0.38), (x0 + 0.9 / n, r - 0.38), (x0 + 0.9 / n, r + 0.38), (x0, r + 0.38)])
                colors.append(rank_color(j) if j in holds else "white")
    cells = [[(c + 0.05, r - 0.38), (c + 0.95, r - 0.38), (c + 0.95, r + 0.38), (c + 0.05, r + 0.38)]
             for r in range(n) for c in range(n)]
    added = [ax.add_collection(PolyCollection(stripes, facecolors=colors, linewidths=0)),
             ax.add_collection(PolyCollection(cells, facecolors="none", edgecolors="#BBBBBB", linewidths=0.8))]
    for t in steps[step - 1] if step else ():
        col = t.src if op == "all_to_all" else t.chunk   # the receiver's slot that changed
        src_col = t.dst if op == "all_to_all" else t.chunk
        color = rank_color(t.src)
        added.append(ax.add_patch(Rectangle((src_col + 0.03, t.src - 0.41), 0.94, 0.82, fill=False,
                                            edgecolor=color, lw=1.6, ls=(0, (3, 2)), zorder=4)))  # what was sent …
        added.append(ax.add_patch(Rectangle((col + 0.02, t.dst - 0.42), 0.96, 0.84, fill=False, edgecolor=color,
                                            lw=2.4, zorder=4)))                                  # … where it landed
        wrap = abs(t.dst - t.src) > 1 or src_col != col   # long arrows bow out to the side
        added.append(ax.add_patch(FancyArrowPatch(
            (src_col + 0.5, t.src), (col + 0.5, t.dst), shrinkA=4, shrinkB=4,
            connectionstyle=f"arc3,rad={0.3 if wrap else 0.0}", arrowstyle="-|>", mutation_scale=16, color=color,
            lw=2.2, zorder=6, path_effects=[withStroke(linewidth=4.5, foreground="white")])))
    sent = max(sum(1 for s in steps[:step] for t in s if t.src == r) for r in range(n))
    chunk = payload_bytes / n
    added.append(fig.text(0.02, 0.955, _describe(op, n, step, len(steps)) + f"\nsent so far by the busiest rank: "
                          f"{sent} chunk{'s' if sent != 1 else ''} = {format_bytes(sent * chunk)}",
                          fontsize=10.5, va="top", ha="left"))
    return added


def collective_sentence(op: str, n: int, step: int, payload_bytes: int) -> str:
    """What one rank has sent so far and will send in all, in words."""
    steps = ring_steps(op, n)
    so_far = max(sum(1 for s in steps[:step] for t in s if t.src == r) for r in range(n))
    total = max(bytes_sent_per_rank(op, n, payload_bytes))
    limit = {"all_reduce": "2S", "broadcast": "S"}.get(op, "S")
    return (f"The busiest rank has sent {so_far} chunk{'s' if so_far != 1 else ''} of "
            f"{format_bytes(payload_bytes / n)} so far; in the whole {OP_NAMES[op]} it sends "
            f"{FACTORS[op][0]} · S = <b>{format_bytes(total)}</b>, never more than {limit} however many ranks "
            "join: that is why rings scale.")
