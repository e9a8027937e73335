"""Efficiency as pictures: the roofline of a device with matmuls placed on it, and each parallel axis's
communication/compute ratio as the sizes change.

    from partrain_edu.viz.efficiency import roofline_figure, ratio_widget
    roofline_figure({"1 token": (1, 2048, 2048), "2048 tokens": (2048, 2048, 2048)})
    ratio_widget()                                    # sliders: hidden, sequence, micro-batch, links, device

The roof is min(peak, intensity × HBM bandwidth) (Williams et al. 2009; `theory.efficiency.attainable_flops`),
the ridge point peak / bandwidth. The ratio is `theory.efficiency.axis_cost`: one step's α–β communication time
on the axis's link over the device's share of the model FLOPs at peak (Austin et al. 2025). A line's colour
says what moves (gradients, parameters, activations), as in `viz.traffic`.
"""
from __future__ import annotations

import ipywidgets as w
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from partrain_edu.theory.efficiency import (
    AXES,
    DEFAULT_LINKS,
    arithmetic_intensity,
    attainable_flops,
    axis_cost,
    ridge_point,
)
from partrain_edu.theory.hardware import DEVICES
from partrain_edu.viz._app import Section, WidgetApp, toggles
from partrain_edu.viz.palette import ACTIVATIONS, FITS, GRADS, INK, OVER, PARAMS, clean, rank_color
from partrain_edu.viz.traffic import LINK_NAMES

# what each axis sends: gradients (dp), parameters and gradients (fsdp), activations (tp, pp; K, V for cp)
STYLES = {"dp": (GRADS, "-"), "fsdp": (PARAMS, "-"), "tp": (ACTIVATIONS, "-"), "pp": (ACTIVATIONS, "--"),
          "cp": (ACTIVATIONS, ":")}
GROUP_SIZES = [2, 4, 8, 16, 32, 64]


def roofline_figure(matmuls: dict[str, tuple[int, int, int]], devices=("a100", "h100"), bytes_per_element: int = 2,
                    measured: dict | None = None) -> Figure:
    """Attainable FLOP/s against arithmetic intensity for each device, each ridge point marked, and each named
    (m, k, n) matmul placed on the last device's roof. ``measured``: {"samples": [(intensity, FLOP/s)],
    "peak": FLOP/s, "bandwidth": bytes/s, "label": str} — a second panel for a machine timed for real."""
    panels = 2 if measured else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.2 * panels, 4.2), squeeze=False)
    ax = axes[0][0]
    intensities = np.logspace(-1, 4, 200)
    for i, name in enumerate(devices):
        device = DEVICES[name]
        roof = [attainable_flops(x, device) / 1e12 for x in intensities]
        ax.plot(intensities, roof, color=rank_color(i), label=f"{device.name}", lw=2)
        ridge = ridge_point(device)
        ax.axvline(ridge, color=rank_color(i), ls=":", lw=1)
        ax.annotate(f"ridge {ridge:.0f}", (ridge, device.peak_flops / 1e12), textcoords="offset points",
                    xytext=(4, -14), fontsize=8, color=rank_color(i))
    last = DEVICES[devices[-1]]
    for i, (label, (m, k, n)) in enumerate(matmuls.items()):
        x = arithmetic_intensity(m, k, n, bytes_per_element)
        y = attainable_flops(x, last) / 1e12
        bound = FITS if x >= ridge_point(last) else OVER
        ax.plot([x], [y], "o", color=bound, ms=7, zorder=5)
        # labels stacked in the empty lower right, a thin line to their dot: neighbours on the roof stay readable
        ax.annotate(f"{label}: {x:.0f} FLOPs/B", (x, y), xytext=(0.98, 0.06 + 0.075 * i), textcoords="axes fraction",
                    ha="right", fontsize=8, color=bound, arrowprops=dict(arrowstyle="-", color=bound, lw=0.6))
    ax.set(xscale="log", yscale="log", xlabel=f"arithmetic intensity (FLOPs per byte, {8 * bytes_per_element}-bit)",
           ylabel="attainable TFLOP/s", title="Roofline: matmuls on the datasheet devices")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    clean(ax)
    if measured:
        _measured_panel(axes[0][1], measured)
    fig.tight_layout()
    return fig


def _measured_panel(ax, measured: dict) -> None:
    """A timed machine's matmuls (dots) under the roof of its best measured FLOP/s and its read bandwidth."""
    xs, ys = zip(*measured["samples"], strict=True)
    grid = np.logspace(np.log10(min(xs)) - 0.5, np.log10(max(xs)) + 0.5, 200)
    roof = np.minimum(measured["peak"], grid * measured["bandwidth"]) / 1e9
    ax.plot(grid, roof, color=INK, lw=2, label="roof: best matmul, read bandwidth")
    ax.plot(xs, np.array(ys) / 1e9, "o", color=rank_color(2), label="a matmul, timed")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOPs per byte, fp32)",
           ylabel="GFLOP/s", title=measured.get("label", "measured"))
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    clean(ax)


def ratio_curves(sizes: dict, links: dict[str, str] | None = None) -> dict[str, list[float]]:
    """{axis: [comm/compute at each of GROUP_SIZES]} for `sizes` (axis_cost's keyword arguments); NaN where the
    axis cannot have that size (more pipeline stages than layers)."""
    links = {**DEFAULT_LINKS, **(links or {})}
    return {axis: [axis_cost(axis, n, link=links[axis], **sizes).ratio if axis != "pp" or n <= sizes["layers"]
                   else float("nan") for n in GROUP_SIZES] for axis in AXES}


def ratio_figure(sizes: dict, links: dict[str, str] | None = None, mark: int | None = None) -> Figure:
    """Comm/compute of each axis against its size n (log–log); above the line at 1 the axis is
    communication-bound unless the collectives overlap something else."""
    links = {**DEFAULT_LINKS, **(links or {})}
    curves = ratio_curves(sizes, links)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for axis, values in curves.items():
        color, style = STYLES[axis]
        ax.plot(GROUP_SIZES, values, style, color=color, lw=2, marker="o", ms=4,
                label=f"{axis} over {LINK_NAMES[links[axis]]}")
    ax.axhline(1, color=INK, lw=1)
    top = max(2.0, np.nanmax([v for values in curves.values() for v in values]) * 1.5)
    ax.axhspan(1, top, color=OVER, alpha=0.06)
    ax.text(GROUP_SIZES[-1], 0.93, "communication = compute", fontsize=8, color=INK, va="top", ha="right")
    if mark:
        ax.axvline(mark, color=INK, ls=":", lw=1)
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xticks=GROUP_SIZES, xticklabels=[str(n) for n in GROUP_SIZES], xlabel="axis size n",
           ylabel="comm time / compute time per step", ylim=(None, top))
    ax.set_title(f"hidden {sizes['hidden']}, {sizes['layers']} layers, seq {sizes['seq']}, "
                 f"{sizes['micro_batch']} seq × {sizes.get('microbatches', 1)} micro-batches per device, "
                 f"{sizes.get('device', 'h100')} at peak", fontsize=9)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    clean(ax)
    fig.tight_layout()
    return fig


def ratio_sentence(sizes: dict, links: dict[str, str], n: int) -> str:
    """The widget's line: each axis's ratio at n, and which are communication-bound."""
    costs = {axis: axis_cost(axis, n, link=links[axis], **sizes) for axis in AXES
             if axis != "pp" or n <= sizes["layers"]}         # no more stages than layers
    bound = [a for a, c in costs.items() if c.ratio >= 1]
    hidden = [a for a, c in costs.items() if c.ratio < 1]
    parts = [f"{a} {c.ratio:.2g}" for a, c in costs.items()]
    return (f"At n = {n}: " + ", ".join(parts) + ". "
            + (f"Communication-bound: {', '.join(bound)}. " if bound else "Every axis can hide its communication. ")
            + (f"Can hide: {', '.join(hidden)}." if hidden else "")
            + ("" if "pp" in costs else f" (pp: at most {sizes['layers']} stages, one per layer.)"))


def _drawer():
    def draw(v: dict):
        sizes = dict(layers=v["layers"], hidden=v["hidden"], seq=v["seq"], vocab=50257, micro_batch=v["micro_batch"],
                     microbatches=v["microbatches"], device=v["device"])
        links = {"dp": v["between"], "fsdp": v["between"], "pp": v["between"], "tp": v["inside"], "cp": v["inside"]}
        return ratio_figure(sizes, links, mark=v["n"]), ratio_sentence(sizes, links, v["n"])
    return draw


def ratio_widget(hidden: int = 2048, layers: int = 24, seq: int = 2048, micro_batch: int = 4) -> WidgetApp:
    """Each axis's comm/compute ratio against its size, as the model, the batch, the device and the links change."""
    style = {"description_width": "initial"}

    def slider(options, value, description, width="300px"):
        # the width holds the label, the read-out and a track of at least 100 px; the right margin keeps the
        # read-out off the next control's label
        return w.SelectionSlider(options=options, value=value, description=description, continuous_update=False,
                                 style=style, layout=w.Layout(width=width, margin="2px 16px 2px 2px"))

    controls = {
        "hidden": slider([2**k for k in range(9, 15)], hidden, "hidden h"),
        "layers": slider([8, 16, 24, 32, 48, 64, 96, 128], layers, "layers"),
        "seq": slider([2**k for k in range(9, 18)], seq, "sequence s"),
        "micro_batch": slider([1, 2, 4, 8, 16, 32, 64], micro_batch, "sequences per micro-batch", "400px"),
        "microbatches": w.Dropdown(options=[1, 2, 4, 8, 16], value=1, description="micro-batches", style=style,
                                   layout=w.Layout(width="170px", margin="2px 16px 2px 2px")),
        "device": toggles([("A100", "a100"), ("H100", "h100")], "h100", "device"),
        "between": toggles([("InfiniBand", "infiniband"), ("10 GbE", "10gbe"), ("NVLink", "nvlink")], "infiniband",
                           "dp, fsdp, pp over", "100px"),
        "inside": toggles([("NVLink", "nvlink"), ("InfiniBand", "infiniband")], "nvlink", "tp, cp over", "100px"),
        "n": slider(GROUP_SIZES, 8, "read at n"),
    }
    section = Section("Communication / compute per axis", _drawer(), tuple(controls),
                      [["hidden", "layers", "seq"], ["micro_batch", "microbatches", "n"],
                       ["device", "between", "inside"]])
    return WidgetApp("efficiency", controls, [section])
