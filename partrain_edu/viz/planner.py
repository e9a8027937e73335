"""Which strategy for this model on these GPUs? The planner's answer with its reason, the memory of the layout
it chose, and what that layout sends per step over which link.

    from partrain_edu.viz import planner_widget
    planner_widget()         # 7.5B on 64 GPUs of 80 GB, 8 per node, InfiniBand between nodes

Everything comes from ``partrain_edu.theory.planner.plan`` (the ``partrain-edu plan`` command): every layout
that fits, timed by the calibrated step-time model (``theory.estimate``), and the simplest family (DDP, FSDP,
FSDP × TP, 3D, CP) within ``SIMPLICITY_MARGIN`` of the fastest: the source notes' decision order, derived
rather than typed in. The memory bar is
``theory.layout_memory`` for the chosen layout's fullest GPU (buffers included); the traffic bars are
``step_traffic`` per parallel group, timed on the links that group crosses as the model prices them
(``theory.network.group_link``: NVLink inside a node, the node's NICs its members own across nodes).
"""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.planner import Plan, plan
from partrain_edu.theory.step_time import axis_link
from partrain_edu.theory.traffic import LINKS, step_traffic
from partrain_edu.units import format_bytes, format_count, parse_size
from partrain_edu.viz._app import (
    DEVICE_MEMORY,
    POWERS_OF_TWO,
    Section,
    WidgetApp,
    link_model_preset,
    model_controls,
    toggles,
)
from partrain_edu.viz._render import Layered
from partrain_edu.viz.palette import ACTIVATIONS, FITS, GRADS, INK, OPTIMIZER, OVER, PARAMS, TRANSIENT, clean
from partrain_edu.viz.traffic import LINK_NAMES

STRATEGY_NAMES = {"ddp": "DDP", "fsdp": "FSDP / ZeRO", "fsdp-tp": "FSDP × TP (2D: ZeRO-3 + TP)",
                  "3d": "3D parallel (TP + PP + DP)", "cp": "context parallel (CP + TP + PP + DP)"}


def layout_memory(chosen: Plan, params: int) -> dict[str, int]:
    """Bytes on the chosen layout's fullest GPU by component (`theory.layout_memory`, as the planner priced it);
    "transient" is its buffers: the framework's allowance, the logits, a recomputed layer, gathered units."""
    mem = chosen.layout.estimate.memory
    return {"params": round(mem.weights), "grads": round(mem.grads), "optimizer": round(mem.optimizer),
            "activations": round(mem.activations), "transient": round(mem.buffers)}


def layout_traffic(chosen: Plan, params: int, gpus: int, gpus_per_node: int, interconnect: str) -> list[tuple]:
    """(group, bytes per step, link name, seconds) for the tp, pp and dp groups of the chosen layout.

    Each group's seconds are its bytes over the link the model prices it on (`theory.step_time.axis_link`:
    NVLink inside a node; across nodes min(NVLink, k NICs) for k members per node), so the
    bars agree with `estimate`; the link name is "nvlink" when one node holds the group, else `interconnect`.
    """
    lay, shape = chosen.layout, chosen.shape
    spread, device = lay.estimate.layout, device_named(lay.estimate.device)
    # tp and pp move this rank's seq/cp positions, as the planner prices them
    kw = dict(layers=shape.layers, hidden=shape.hidden, seq=chosen.seq // lay.cp, micro_batch=lay.micro_batch,
              microbatches=lay.microbatches)

    def seconds(axis: str, nbytes: float) -> tuple[str, float]:
        link = axis_link(spread, axis, device)            # what `estimate` prices this group's collectives on
        return ("nvlink" if link.fabric == "nvlink" else interconnect), nbytes / link.beta

    dp_name = "ddp" if lay.zero == 0 else f"zero{lay.zero}"
    rows = [(f"TP all-reduces (tp={lay.tp})", step_traffic("tp", tp=lay.tp, pp=lay.pp, **kw), "tp"),
            (f"PP sends (pp={lay.pp})", step_traffic("pp", pp=lay.pp, **kw), "pp"),
            (f"DP {'all-reduce' if lay.zero == 0 else f'ZeRO-{lay.zero}'} "
             f"(dp={lay.dp}{f' × cp={lay.cp}' if lay.cp > 1 else ''})",
             # as the planner prices it: a cp plan reduces its replicated gradients over dp × cp
             step_traffic(dp_name, params, dp=lay.dp * lay.cp, tp=lay.tp, pp=lay.pp, microbatches=lay.microbatches),
             "dp")]
    return [(name, t.per_rank_bytes_sent, *seconds(axis, t.per_rank_bytes_sent)) for name, t, axis in rows]


MEMORY_PARTS = (("params", "parameters", PARAMS), ("grads", "gradients", GRADS),
                ("optimizer", "optimizer states", OPTIMIZER), ("activations", "activations", ACTIVATIONS),
                ("transient", "transient buffers", TRANSIENT))


def planner_figure(chosen: Plan, params: int, gpu_memory: int, gpus: int, gpus_per_node: int = 8,
                   interconnect: str = "infiniband") -> Figure:
    """Left: the chosen layout's bytes per GPU against the device; right: bytes per step per group and time."""
    fig = _frame(gpu_memory, _top(chosen, gpu_memory))
    _data(fig, chosen, params, gpu_memory, gpus, gpus_per_node, interconnect)
    return fig


def _top(chosen: Plan, gpu_memory: int) -> float:
    return max(chosen.layout.bytes_per_device, gpu_memory) / 1e9 * 1.15


def _frame(gpu_memory: int, top: float) -> Figure:
    """What depends only on the GPU's memory: both axes, the memory scale and legend, the GPU's lines."""
    fig, (mem_ax, net_ax) = plt.subplots(1, 2, figsize=(11.5, 4.2),
                                         gridspec_kw={"width_ratios": [1.15, 2], "wspace": 0.5})
    fig.subplots_adjust(left=0.06, right=0.97, top=0.78, bottom=0.13)
    # in the frame, under the bars: a chosen layout fits below the GPU line, so no bar reaches it
    mem_ax.axhline(gpu_memory / 1e9, color=INK, ls="--", lw=1.3)
    mem_ax.text(0.42, gpu_memory / 1e9, f"{format_bytes(gpu_memory)} GPU", va="bottom", fontsize=8.5)
    mem_ax.set_xlim(-0.45, 1.7)
    mem_ax.set_ylim(0, top)
    mem_ax.set_xticks([])
    mem_ax.set_ylabel("GB per GPU")
    handles = [Patch(facecolor=color, edgecolor="white", label=label) for _, label, color in MEMORY_PARTS]
    mem_ax.legend(handles=handles, loc="lower right", fontsize=8, frameon=False)  # below the lines: a layout fits
    clean(mem_ax)
    net_ax.set_ylim(2.5, -0.5)  # three rows: the tp, pp and dp groups
    net_ax.set_xlabel("GB sent per step by the busiest rank of each group")
    clean(net_ax)
    fig.suptitle(" ", fontsize=10.5)  # its text is the data's
    return fig


def _data(fig: Figure, chosen: Plan, params: int, gpu_memory: int, gpus: int, gpus_per_node: int,
          interconnect: str) -> list:
    """The chosen layout: memory bars, traffic bars, their numbers and ticks, the titles; returns them."""
    mem_ax, net_ax = fig.axes
    lay, parts = chosen.layout, layout_memory(chosen, params)
    traffic = layout_traffic(chosen, params, gpus, gpus_per_node, interconnect)
    top, bottom = _top(chosen, gpu_memory), 0.0
    added = [mem_ax.spines["bottom"], net_ax.spines["left"]]  # drawn over the bars' white edges, as in a full draw
    for key, label, color in MEMORY_PARTS:
        h = parts[key] / 1e9
        added.append(mem_ax.bar(0, h, 0.6, bottom=bottom, color=color, label=label, edgecolor="white"))
        if h >= 0.06 * top:
            added.append(mem_ax.text(0, bottom + h / 2, f"{h:.1f}", ha="center", va="center", color="white",
                                     fontsize=9, fontweight="bold"))
        bottom += h
    fits = lay.bytes_per_device <= gpu_memory
    added.append(mem_ax.text(0, bottom + top * 0.01, format_bytes(lay.bytes_per_device), ha="center", va="bottom",
                             fontweight="bold", color=FITS if fits else OVER))

    added.append(net_ax.barh(range(len(traffic)), [row[1] / 1e9 for row in traffic], 0.6,
                             color=[ACTIVATIONS, ACTIVATIONS, GRADS]))
    largest = max([row[1] for row in traffic] + [1]) / 1e9
    for y, (_, nbytes, lk, seconds) in enumerate(traffic):
        text = (f"{format_bytes(nbytes)} over {LINK_NAMES[lk]} ≥ {seconds:.3g} s" if nbytes
                else "nothing (degree 1)")
        added.append(net_ax.text(nbytes / 1e9 + largest * 0.01, y, text, va="center", fontsize=9))
    net_ax.set_yticks(range(len(traffic)), [row[0] for row in traffic], fontsize=9)
    net_ax.set_xlim(0, largest * 1.9)
    added += [net_ax.xaxis, net_ax.yaxis]  # their ticks follow the layout
    added.append(net_ax.set_title(f"estimated step {lay.step_time_s:.3g} s, of which communication not hidden "
                                  f"{lay.exposed_comm_s:.3g} s", fontsize=10))
    shape = chosen.shape
    added.append(fig.suptitle(
        f"{format_count(params)} on {gpus} GPUs → {STRATEGY_NAMES[lay.strategy]}: {_degrees(lay)}; "
        f"micro-batch {lay.micro_batch} × {lay.microbatches}, recompute "
        f"{lay.recompute}\n(assumed shape: {shape.layers} layers × hidden {shape.hidden}, {shape.heads} heads, "
        f"seq {chosen.seq})", fontsize=10.5))
    return added


def _degrees(lay) -> str:
    """'dp=32 tp=4 pp=8 vpp=8 ZeRO-2': the layout's degrees (`Layout.text` without the family)."""
    return lay.text().split(" ", 1)[1]


def _drawer():
    painter = Layered()  # one per widget: its frame is redrawn only for another GPU memory

    def draw(v: dict) -> tuple[Figure, str, bytes]:
        params, memory = parse_size(v["params"]), parse_size(v["device"])
        chosen = plan(params, v["gpus"], memory, v["gpus_per_node"], v["interconnect"])
        fig, png = painter.paint((memory, _top(chosen, memory)), lambda: _frame(memory, _top(chosen, memory)),
                                 lambda fig: _data(fig, chosen, params, memory, v["gpus"], v["gpus_per_node"],
                                                   v["interconnect"]))
        lay = chosen.layout
        return fig, (f"Recommendation: <b>{STRATEGY_NAMES[lay.strategy]}</b> ({_degrees(lay)}). "
                     f"Why: {chosen.reason}"), png
    return draw


def planner_widget(params: str = "7.5B", gpus: int = 64) -> WidgetApp:
    """Model size and hardware → ``partrain-edu plan``'s recommendation, its memory and its traffic."""
    style = {"description_width": "initial"}
    controls = {
        **model_controls(params),
        "gpus": w.SelectionSlider(options=POWERS_OF_TWO, value=gpus, description="GPUs", continuous_update=False,
                                  style=style, layout=w.Layout(width="320px")),
        "gpus_per_node": toggles([1, 2, 4, 8], 8, "GPUs per node", "38px"),
        "device": toggles(DEVICE_MEMORY, "80 GB", "GPU memory", "74px"),
        "interconnect": toggles([(LINK_NAMES[k], k) for k in LINKS], "infiniband", "between nodes", "104px"),
    }
    rows = [["preset", "params", "gpus"], ["gpus_per_node", "device"], ["interconnect"]]
    watch = ("params", "gpus", "gpus_per_node", "device", "interconnect")
    return WidgetApp("planner", controls, [Section("", _drawer(), watch, rows)], links=link_model_preset)
