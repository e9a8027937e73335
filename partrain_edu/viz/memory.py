"""The memory wall (显存墙) as a picture: bytes per device for ZeRO stages 0–3 side by side, against the device.

    from partrain_edu.viz import memory_widget
    memory_widget()          # opens on the source notes' example: 7.5B, mixed precision + Adam, one device

Each bar stacks what one device holds — parameters, gradients, optimizer states, activations — with the value
in GB on the bar; the dashed line is the device's memory. The four bars are the ZeRO paper's table
(Rajbhandari et al. 2020, Figure 1) drawn: stage 0 is plain DDP, stages 1–3 shard the optimizer states, then
the gradients, then the parameters over the dp data-parallel devices. All numbers come from
``partrain_edu.theory.memory.estimate_memory`` (the ``partrain-edu memory`` command); for activations the
model's shape is the planner's assumed GPT-3-like shape for its size.
"""

from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from partrain_edu.theory.memory import BYTES_PER_PARAM, MemoryEstimate, estimate_memory
from partrain_edu.theory.planner import assumed_shape
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
from partrain_edu.viz.palette import ACTIVATIONS, FITS, GRADS, INK, OPTIMIZER, OVER, PARAMS, clean

STAGE_NAMES = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
STAGE_NOTES = ["no sharding\n(ZeRO-0)", "optimizer states\nsharded", "+ gradients\n(FSDP SHARD_GRAD_OP)",
               "+ parameters\n(FSDP FULL_SHARD)"]
COMPONENTS = [("params", "parameters", PARAMS), ("grads", "gradients", GRADS),
              ("optimizer", "optimizer states", OPTIMIZER), ("activations", "activations", ACTIVATIONS)]


def zero_stage_estimates(params: int | float | str, *, micro_batch: int | None = None, seq: int = 2048,
                         **kwargs) -> list[MemoryEstimate]:
    """``estimate_memory`` for ZeRO stages 0, 1, 2, 3 with everything else equal.

    With ``micro_batch`` the activations are included, for the planner's assumed shape of a model this size.
    Other keyword arguments (dp, tp, pp, precision, optimizer, recompute, …) go to ``estimate_memory``.
    """
    params = parse_size(params) if isinstance(params, (str, float)) else params
    shape = {}
    if micro_batch:
        s = assumed_shape(params)
        shape = dict(layers=s.layers, hidden=s.hidden, heads=s.heads, seq=seq, micro_batch=micro_batch)
    return [estimate_memory(params, zero=z, **shape, **kwargs) for z in range(4)]


def memory_figure(estimates: list[MemoryEstimate], *, selected: int = 0, device_bytes: int = 80 * 10**9,
                  title: str = "", dp: int | None = None) -> Figure:
    """Stacked bars (GB per device) of the four ZeRO stages; ``selected`` is outlined, the others faded."""
    fig = _frame(estimates, title)
    _scale(fig, estimates, device_bytes, title)
    _data(fig, estimates, selected, device_bytes, dp)
    return fig


def _top(estimates: list[MemoryEstimate], device_bytes: int) -> float:
    return max([e.total_bytes for e in estimates] + [device_bytes]) / 1e9 * 1.2


def _components(estimates: list[MemoryEstimate]) -> list[tuple[str, str, str]]:
    return [c for c in COMPONENTS if c[0] != "activations" or any(e.activations_bytes for e in estimates)]


def _frame(estimates: list[MemoryEstimate], title: str) -> Figure:
    """What changes only with the kinds of memory shown: the axes, the stages' names, the legend."""
    if len(estimates) != 4:
        raise ValueError("give four estimates, for ZeRO stages 0–3")
    fig, ax = plt.subplots(figsize=(10, 4.9))
    fig.subplots_adjust(left=0.07, right=0.86, top=0.8 if "\n" in title else 0.85, bottom=0.17)
    ax.set_xticks(range(4), [f"{n}\n{d}" for n, d in zip(STAGE_NAMES, STAGE_NOTES, strict=True)], fontsize=9)
    ax.set_xlim(-0.5, 3.5)
    ax.set_ylabel("GB per device")
    clean(ax)
    handles = [Patch(color=color, label=label) for _, label, color in _components(estimates)]
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=len(handles), frameon=False,
              fontsize=9)
    if title:
        fig.suptitle(" ", fontsize=11)  # its text is the scale's
    return fig


def _scale(fig: Figure, estimates: list[MemoryEstimate], device_bytes: int, title: str) -> list:
    """What changes with the model and the device, not with the ZeRO stage or dp: the GB scale, the device's
    memory, the title; returns them."""
    ax = fig.axes[0]
    top = _top(estimates, device_bytes)
    device = device_bytes / 1e9
    ax.set_ylim(0, top)
    right = ax.get_yaxis_transform()  # x in axes fractions, y in GB: labels in the right margin
    added = [ax.axhspan(device, top, color=OVER, alpha=0.05, lw=0),  # above the line: out of memory
             ax.text(1.01, device, f"{device:.4g} GB\ndevice", transform=right, va="top", fontsize=10, color=INK),
             ax.text(1.01, device, "▲ out of\n   memory", transform=right, va="bottom", fontsize=9, color=OVER),
             ax.yaxis]
    if title:
        added.append(fig.suptitle(title, fontsize=11))
    return added


def _data(fig: Figure, estimates: list[MemoryEstimate], selected: int, device_bytes: int,
          dp: int | None = None) -> list:
    """The bars, their values, the outline of the selected stage (and dp); returns what it added."""
    if selected not in range(4):
        raise ValueError("selected must be a ZeRO stage, 0–3")
    ax = fig.axes[0]
    top = _top(estimates, device_bytes)
    device = device_bytes / 1e9
    # the axis lines go over the bars' white edges, the shading and the device line, as in a full draw
    added, bottom = [ax.spines["bottom"], ax.spines["left"]], [0.0] * 4
    for key, label, color in _components(estimates):
        heights = [getattr(e, f"{key}_bytes") / 1e9 for e in estimates]
        bars = ax.bar(range(4), heights, 0.62, bottom=bottom, color=color, label=label, edgecolor="white", lw=1)
        added.append(bars)
        for stage, (bar, h) in enumerate(zip(bars, heights, strict=True)):
            bar.set_alpha(1.0 if stage == selected else 0.4)
            if h >= 0.05 * top:  # the value, where it fits inside the segment
                added.append(ax.text(stage, bottom[stage] + h / 2, _gb(h), ha="center", va="center",
                                     color="white", fontsize=10, fontweight="bold"))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    for stage, total in enumerate(bottom):
        added.append(ax.text(stage, total + top * 0.015, f"{_gb(total)} GB", ha="center", va="bottom", fontsize=11,
                             fontweight="bold", color=FITS if total <= device else OVER,
                             alpha=1.0 if stage == selected else 0.6))
    added.append(ax.add_patch(Rectangle((selected - 0.36, 0), 0.72, bottom[selected] + top * 0.085, fill=False,
                                        edgecolor=INK, lw=1.6, ls=(0, (4, 2)), zorder=5)))
    added.append(ax.axhline(device, color=INK, ls="--", lw=1.4))  # over the bars: where the device ends
    if dp is not None:
        added.append(ax.text(-0.45, top * 0.97, f"data parallel dp = {dp}: ZeRO shards over {dp} device"
                             + ("s" if dp > 1 else ""), va="top", fontsize=10, color=INK))
    return added


def _gb(value: float) -> str:
    return format_bytes(value * 1e9).split()[0] if value >= 1 else f"{value:.2f}"


def join_names(names: list[str]) -> str:
    """An English list: "ZeRO-3", "ZeRO-2 and ZeRO-3", "ZeRO-1, ZeRO-2 and ZeRO-3"."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def fits_sentence(estimates: list[MemoryEstimate], selected: int, device_bytes: int, dp: int) -> str:
    """One sentence on what fits (and what to try when nothing does)."""
    total, name = estimates[selected].total_bytes, STAGE_NAMES[selected]
    verdict = (f"✓ <b>{name}</b> fits: {format_bytes(total)} of {format_bytes(device_bytes)} per device"
               if total <= device_bytes else
               f"✗ <b>{name}</b> needs {format_bytes(total)} per device, {format_bytes(total - device_bytes)} "
               f"more than the {format_bytes(device_bytes)} device: out of memory")
    fitting = [STAGE_NAMES[z] for z, e in enumerate(estimates) if e.total_bytes <= device_bytes]
    if dp == 1:
        hint = "with dp = 1 every ZeRO stage is the same (ZeRO shards over data-parallel devices): raise dp"
    elif not fitting:
        hint = f"no stage fits at dp = {dp}: raise dp, split the model with tp/pp, or shrink the activations"
    elif len(fitting) == 4:
        hint = "every stage fits: plain DDP is enough (it also sends the least)"
    else:
        hint = f"{join_names(fitting)} fit{'s' if len(fitting) == 1 else ''}"
    return f"{verdict}; {hint}."


def _drawer():
    painter = Layered()  # one per widget: frame, then scale and title, then the bars, each kept till it changes

    def draw(v: dict) -> tuple[Figure, str, bytes]:
        params = parse_size(v["params"])
        device = parse_size(v["device"])
        micro_batch = v["micro_batch"] or None
        estimates = zero_stage_estimates(params, dp=v["dp"], tp=v["tp"], pp=v["pp"], precision=v["precision"],
                                         optimizer=v["optimizer"], micro_batch=micro_batch, seq=v["seq"],
                                         recompute=v["recompute"])
        per_param = "+".join(map(str, BYTES_PER_PARAM[v["precision"], v["optimizer"]]))
        title = (f"{format_count(params)} parameters, {v['precision']} precision + {v['optimizer']} "
                 f"({per_param} bytes per parameter), tp={v['tp']} pp={v['pp']}")
        if micro_batch:
            s = assumed_shape(params)
            title += (f"\nactivations: {s.layers} layers × hidden {s.hidden}, seq {v['seq']}, micro-batch "
                      f"{micro_batch}, recompute {v['recompute']}, 1F1B")
        frame_key = (len(_components(estimates)), "\n" in title)
        fig, png = painter.paint(frame_key, lambda: _frame(estimates, title),
                                 lambda fig: _data(fig, estimates, v["zero"], device, dp=v["dp"]),
                                 middle=((title, device, _top(estimates, device)),
                                         lambda fig: _scale(fig, estimates, device, title)))
        return fig, fits_sentence(estimates, v["zero"], device, v["dp"]), png
    return draw


def memory_widget(params: str = "7.5B", dp: int = 1, zero: int = 0, device: str = "80 GB") -> WidgetApp:
    """Move the controls; the bars are ``partrain-edu memory`` for each ZeRO stage (see the module docstring)."""
    slider = dict(continuous_update=False, style={"description_width": "initial"}, layout=w.Layout(width="330px"))
    controls = {
        **model_controls(params),
        "device": toggles(DEVICE_MEMORY, device, "device memory", "74px"),
        "dp": w.SelectionSlider(options=POWERS_OF_TWO, value=dp, description="data parallel dp", **slider),
        "tp": toggles([1, 2, 4, 8], 1, "tensor parallel tp", "38px"),
        "pp": toggles([1, 2, 4, 8, 16], 1, "pipeline pp", "38px"),
        "zero": toggles([(n, z) for z, n in enumerate(STAGE_NAMES)], zero, "ZeRO stage", "80px"),
        "precision": toggles(["mixed", "fp32"], "mixed", "precision", "70px"),
        "optimizer": toggles(["adam", "sgd"], "adam", "optimizer"),
        "micro_batch": w.Dropdown(options=[("off", 0)] + [(str(b), b) for b in (1, 2, 4, 8, 16)], value=0,
                                  description="activations: micro-batch", style={"description_width": "initial"},
                                  layout=w.Layout(width="250px")),
        "seq": w.Dropdown(options=[512, 1024, 2048, 4096, 8192], value=2048, description="sequence",
                          style={"description_width": "initial"}, layout=w.Layout(width="160px")),
        "recompute": toggles(["none", "selective", "full"], "none", "recompute", "90px"),
    }
    rows = [["preset", "params", "device"], ["dp", "tp", "pp"], ["zero", "precision", "optimizer"],
            ["micro_batch", "seq", "recompute"]]
    watch = tuple(name for name in controls if name != "preset")
    return WidgetApp("memory", controls, [Section("", _drawer(), watch, rows)], links=link_model_preset)
