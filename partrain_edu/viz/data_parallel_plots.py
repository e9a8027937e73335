"""Figures and small tables of notebook 02 (data parallelism): the loss curves of every data-parallel run, and
DDP's overlap of bucketed all-reduces with backward on the emulated device's clock.

    from partrain_edu.viz.data_parallel_plots import loss_curves, overlap_figure, stream_schedule
"""
from __future__ import annotations

from partrain_edu.viz.palette import BACKWARD, GRADS, INK, lighten, rank_color

MS = 1e3


def loss_curves(single: dict, runs: dict, title: str = "Same math: every data-parallel curve is single's"):
    """Each run's losses over single's (a wide grey band): `runs` is {label: report}."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    steps = range(1, len(single["losses"]) + 1)
    ax.plot(steps, single["losses"], color="black", lw=6, alpha=0.25, label="single (1 process, batch 16)")
    for k, (label, run) in enumerate(runs.items()):
        ax.plot(steps, run["losses"], color=rank_color(k), lw=0.8, marker="osx^"[k % 4], ms=7 - 1.5 * k,
                mfc="none", label=label)
    ax.set(xlabel="step", ylabel="loss (global-batch mean)", title=title)
    ax.legend()
    return fig


def stream_schedule(ready_s: list[float], comm_s: list[float]) -> list[tuple[float, float]]:
    """(start, end) of each bucket's all-reduce on one communication stream: bucket i starts when it is ready
    and the previous one has ended (`theory.traffic.bucketed_backward_end` returns the last end)."""
    spans, free = [], 0.0
    for ready, comm in zip(ready_s, comm_s, strict=True):
        start = max(ready, free)
        free = start + comm
        spans.append((start, free))
    return spans


def overlap_figure(runs: dict, caption: str = ""):
    """One panel per run of {name: {"timeline": DistributedDataParallel.timeline entry, "comm_s": [seconds per
    bucket]}}: backward compute, then each bucket from ready (launched) through waiting for the stream (light)
    and its all-reduce (α–β seconds); the black line is when the gradients were ready (measured)."""
    import matplotlib.pyplot as plt

    heights = [len(run["timeline"]["buckets"]) + 1 for run in runs.values()]
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.2 + 0.45 * sum(heights)), sharex=True,
                             height_ratios=heights, squeeze=False)
    for ax, (name, run) in zip(axes[:, 0], runs.items(), strict=True):
        t = run["timeline"]
        ready = [b["launched"] for b in t["buckets"]]
        ax.barh(0, t["compute_end"] * MS, color=BACKWARD, label="backward compute")
        for k, ((start, end), r) in enumerate(zip(stream_schedule(ready, run["comm_s"]), ready, strict=True), start=1):
            ax.barh(k, (start - r) * MS, left=r * MS, color=lighten(GRADS, 0.6),
                    label="ready, waiting for the stream" if k == 1 else None)
            ax.barh(k, (end - start) * MS, left=start * MS, color=GRADS, label="all-reduce" if k == 1 else None)
        ax.set_yticks(range(len(ready) + 1), ["backward"] + [f"bucket {b['bucket']}" for b in t["buckets"]])
        ax.axvline(t["synced"] * MS, color=INK, lw=1.5)
        ax.invert_yaxis()
        ax.set_title(f"{name}: gradients ready {t['synced'] * MS:.0f} ms after backward began")
    axes[0, 0].legend(loc="lower right", fontsize=8)
    axes[-1, 0].set_xlabel(caption or "emulated ms since backward began (black line: gradients ready)")
    fig.tight_layout()
    return fig
