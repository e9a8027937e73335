"""Collective traffic as pictures: a collective step by step (``viz.ring``), and the bytes one training step
sends under each strategy, with the time they take on NVLink, InfiniBand, 10 GbE and 1 GbE.

    from partrain_edu.viz import traffic_widget
    traffic_widget()                                        # ring all-reduce over 4 ranks; 7.5B per strategy
    traffic_widget(measured={"ddp": report["comm"]})        # overlay what a real run sent (CommTracer)

Per-strategy bytes are ``theory.traffic.step_traffic`` (the ``partrain-edu traffic`` command): DDP all-reduces
the gradients, 2(n−1)/n · 2Ψ bytes ≈ 4Ψ for 16-bit gradients; ZeRO-1 and -2 send the same as a
reduce-scatter plus an all-gather; ZeRO-3 also all-gathers the parameters again for the backward: 1.5×
(Rajbhandari et al. 2020, §7); TP all-reduces activations four times per layer (Shoeybi et al. 2019); PP
sends only boundary activations; CP sends (c−1)/c of each layer's K and V around its ring, point to point, per
pass, backward also dK and dV (ring attention, Liu et al. 2023; its gradients' all-reduce is DP's). A bar's
colour says what moves. Times divide by one link's bandwidth (``theory.traffic.LINKS``): lower bounds.
"""

from __future__ import annotations

import math

import ipywidgets as w
import matplotlib.pyplot as plt
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from partrain_edu.theory.planner import assumed_shape
from partrain_edu.theory.ring_steps import RING_OPS, ring_steps
from partrain_edu.theory.traffic import LINKS, StepTraffic, link_time, step_traffic
from partrain_edu.units import format_bytes, format_count, parse_size
from partrain_edu.viz._app import POWERS_OF_TWO, Section, WidgetApp, link_model_preset, model_controls, toggles
from partrain_edu.viz._render import Layered
from partrain_edu.viz.palette import ACTIVATIONS, GRADS, INK, PARAMS, clean
from partrain_edu.viz.ring import OP_NAMES, check_step, collective_data, collective_frame, collective_sentence

ROWS = [("ddp", "DDP"), ("zero1", "ZeRO-1"), ("zero2", "ZeRO-2"), ("zero3", "ZeRO-3"), ("tp", "TP"), ("pp", "PP"),
        ("cp", "CP")]
LINK_NAMES = {"nvlink": "NVLink", "infiniband": "InfiniBand", "10gbe": "10 GbE", "1gbe": "1 GbE"}
MOVES = {("all_reduce", False): ("gradients", GRADS), ("reduce_scatter", False): ("gradients", GRADS),
         ("all_gather", False): ("parameters", PARAMS), ("all_reduce", True): ("activations", ACTIVATIONS),
         ("send", True): ("activations", ACTIVATIONS)}
MODEL_AXES = ("tp", "pp", "cp")  # rows that send activations, each over its own degree


def strategy_traffic(params: int | str, *, dp: int = 8, tp: int = 8, pp: int = 4, cp: int = 4,
                     microbatches: int = 1, layers: int | None = None, hidden: int | None = None, seq: int = 2048,
                     micro_batch: int = 1, bytes_per_element: int = 2) -> dict:
    """{strategy: StepTraffic} for the seven rows; DDP/ZeRO over dp, TP over tp, PP over pp, CP over cp (one at
    a time; CP's row holds its K/V ring alone, nothing to send at cp = 1).

    Without ``layers``/``hidden`` the TP, PP and CP rows use the planner's assumed shape of a model this size.
    """
    params = parse_size(params) if isinstance(params, (str, float)) else params
    if layers is None or hidden is None:
        shape = assumed_shape(params)
        layers, hidden = shape.layers, shape.hidden
    shape_kw = dict(layers=layers, hidden=hidden, seq=seq, micro_batch=micro_batch, microbatches=microbatches,
                    bytes_per_element=bytes_per_element)
    out = {s: step_traffic(s, params, dp=dp, microbatches=microbatches, bytes_per_element=bytes_per_element)
           for s in ("ddp", "zero1", "zero2", "zero3")}
    out["tp"] = step_traffic("tp", tp=tp, **shape_kw)
    out["pp"] = step_traffic("pp", pp=pp, **shape_kw)
    # step_traffic refuses cp = 1 (no ring); the row then sends nothing, as TP's does at tp = 1
    out["cp"] = step_traffic("cp", cp=cp, **shape_kw) if cp > 1 else StepTraffic("cp", ())
    return out


def strategy_traffic_figure(traffic: dict, *, degrees: dict[str, int] | None = None,
                            measured: dict[str, dict] | None = None, title: str = "") -> Figure:
    """Bytes the busiest rank sends per step (bars, coloured by what moves) and the time on each link.

    ``measured``: {strategy: a train report's "comm" dict ({op: {"calls", "bytes"}})} drawn as ◆ on its row.
    """
    fig = _frame(len(_rows(traffic)), bool(title))
    _data(fig, traffic, degrees or {}, measured, title)
    return fig


def _rows(traffic: dict) -> list[tuple[str, str]]:
    return [(key, label) for key, label in ROWS if key in traffic]


def _frame(rows: int, titled: bool) -> Figure:
    """What stays whatever the model and degrees: the two axes, the links' column heads."""
    fig, (bars, table) = plt.subplots(1, 2, figsize=(12, 4.2), gridspec_kw={"width_ratios": [1.35, 1], "wspace": 0.05})
    fig.subplots_adjust(left=0.13, right=0.985, top=0.8, bottom=0.14)
    bars.set_ylim(rows - 0.5, -0.6)
    clean(bars)
    table.set_xlim(-0.5, len(LINKS) - 0.5)
    table.set_ylim(rows - 0.5, -0.6)
    table.set_xticks(range(len(LINKS)), [f"{LINK_NAMES[k]}\n{LINKS[k] / 1e9:g} GB/s" for k in LINKS], fontsize=9)
    table.xaxis.tick_top()
    table.set_yticks([])
    clean(table, keep=())
    table.tick_params(length=0)
    table.set_xlabel("time on one link (bandwidth only: a lower bound)", fontsize=9)
    if titled:
        fig.suptitle(" ", fontsize=11)  # its text is the data's
    return fig


def _data(fig: Figure, traffic: dict, degrees: dict[str, int], measured: dict[str, dict] | None, title: str) -> list:
    """The bars, their numbers, the legend, the time table and the title; returns them."""
    bars, table = fig.axes
    rows = _rows(traffic)
    largest = max([t.per_rank_bytes_sent for t in traffic.values()]
                  + [sum(op["bytes"] for op in comm.values()) for comm in (measured or {}).values()] + [1])
    unit, scale = next((u, f) for u, f in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3), ("B", 1)) if largest >= f or f == 1)
    seen = {}
    pieces = []
    added = [bars.spines["left"]]  # the spine over the bars' white edges, as a full draw
    for y, (key, _) in enumerate(rows):
        left = 0
        for c in traffic[key].collectives:
            what, color = MOVES[c.op, key in MODEL_AXES]
            pieces.append((y, c.bytes_sent / scale, left / scale, color))
            seen[what] = color
            left += c.bytes_sent
        note = format_bytes(left) if left else "0 B (nothing to send at this degree)"
        added.append(bars.text(left / scale + largest / scale * 0.03, y, note, va="center", fontsize=9, color=INK))
        if measured and key in measured:
            got = sum(op["bytes"] for op in measured[key].values())
            added += bars.plot([got / scale], [y], "D", color="black", ms=7, zorder=5)
            same = "= predicted ✓" if got == left else f"vs {format_bytes(left)} predicted"
            added.append(bars.text(got / scale, y - 0.42, f"measured {format_bytes(got)} {same}", fontsize=8,
                                   ha="left", va="bottom"))
    if pieces:  # one call for every piece: one container, drawn in the order the rows stack them
        ys, widths, lefts, colors = zip(*pieces, strict=True)
        added.append(bars.barh(ys, widths, left=lefts, color=colors, height=0.62, edgecolor="white"))
    bars.set_yticks(range(len(rows)), [f"{label} ({degree_text(key, degrees)})" if degrees else label
                                        for key, label in rows], fontsize=9)
    bars.set_xlim(0, largest / scale * 1.45)
    bars.set_xlabel(f"{unit} sent per step by the busiest rank")
    added += [bars.xaxis, bars.yaxis]
    added.append(bars.legend(handles=[Patch(color=c, label=f"{what}") for what, c in seen.items()], loc="lower right",
                             fontsize=8, frameon=False, title="what moves", title_fontsize=8))

    # time on each link, coloured from green (hidden easily) to red (dominates the step), log scale:
    # one collection of cells (a patch each costs more to add and draw), its text on each
    cmap = plt.get_cmap("RdYlGn_r")
    cells = []
    shades = []
    for y, (key, _) in enumerate(rows):
        for x, link in enumerate(LINKS):
            seconds = link_time(traffic[key].per_rank_bytes_sent, link)
            shade = 0.0 if seconds <= 0 else min(1.0, max(0.0, (math.log10(seconds) + 3) / 5))  # 1 ms … 100 s
            cells.append([(x - 0.48, y - 0.4), (x + 0.48, y - 0.4), (x + 0.48, y + 0.4), (x - 0.48, y + 0.4)])
            shades.append(to_rgba(cmap(shade), 0.75 if seconds else 0.15))
            added.append(table.text(x, y, _seconds(seconds), ha="center", va="center", fontsize=9))
    added.append(table.add_collection(PolyCollection(cells, facecolors=shades, edgecolors=shades, linewidths=1.0)))
    if title:
        added.append(fig.suptitle(title, fontsize=11))
    return added


def degree_text(key: str, degrees: dict[str, int]) -> str:
    axis = key if key in MODEL_AXES else "dp"
    return f"{axis}={degrees.get(axis, 1)}"


def _seconds(s: float) -> str:
    if s == 0:
        return "—"
    return f"{s * 1e6:.3g} µs" if s < 1e-3 else f"{s * 1e3:.3g} ms" if s < 1 else f"{s:.3g} s"


def _collective_drawer():
    painter = Layered()  # one per widget: the labels and the curve are redrawn only for a new op, n or S

    def draw(v: dict) -> tuple[Figure, str, bytes]:
        op = v["op"]
        n = v["ranks"]
        step = v["step"]
        size = parse_size(v["size"])
        check_step(op, n, step)
        fig, png = painter.paint((op, n, size), lambda: collective_frame(op, n, size),
                                 lambda fig: collective_data(fig, op, n, step, size))
        return fig, collective_sentence(op, n, step, size), png
    return draw


def _strategy_drawer(measured: dict | None):
    painter = Layered()  # one per widget: the axes and the links' column heads are kept

    def draw(v: dict) -> tuple[Figure, str, bytes]:
        params = parse_size(v["params"])
        kw = dict(dp=v["dp"], tp=v["tp"], pp=v["pp"], cp=v["cp"], microbatches=v["microbatches"])
        traffic = strategy_traffic(params, bytes_per_element=v["element"], **kw)
        shape = assumed_shape(params)
        title = (f"{format_count(params)} parameters ({8 * v['element']}-bit), {v['microbatches']} micro-batch(es) "
                 "per step; TP/PP/CP: "
                 f"{shape.layers} layers × hidden {shape.hidden}, seq 2048, micro-batch 1")
        fig, png = painter.paint(len(ROWS), lambda: _frame(len(ROWS), True),
                                 lambda fig: _data(fig, traffic, kw, measured, title))
        ratio = traffic["zero3"].per_rank_bytes_sent / max(traffic["ddp"].per_rank_bytes_sent, 1)
        sentence = (f"DDP sends {format_bytes(traffic['ddp'].per_rank_bytes_sent)} per step; ZeRO-3 "
                    f"{ratio:.2g}× that"
                    + (" (1.5× at one micro-batch: the extra all-gather)" if v["microbatches"] == 1 else "")
                    + ". On 1 GbE the DDP all-reduce alone takes "
                    + f"{_seconds(link_time(traffic['ddp'].per_rank_bytes_sent, '1gbe'))}.")
        return fig, sentence, png
    return draw


def traffic_widget(op: str = "all_reduce", ranks: int = 4, params: str = "7.5B", dp: int = 8,
                   bytes_per_element: int = 2, measured: dict[str, dict] | None = None) -> WidgetApp:
    """A collective step by step, and bytes per strategy per step; ``measured``: {strategy: report["comm"]}."""
    style = {"description_width": "initial"}
    n_steps = len(ring_steps(op, ranks))
    controls = {
        "op": toggles([(OP_NAMES[o], o) for o in RING_OPS], op, "collective", "120px"),
        "ranks": w.IntSlider(ranks, min=2, max=16, description="ranks n", continuous_update=False, style=style),
        "size": w.Text("1GB", description="message S", continuous_update=False, style=style,
                       layout=w.Layout(width="170px")),
        "play": w.Play(value=0, min=0, max=n_steps, interval=1200, description="play"),
        "step": w.IntSlider(0, min=0, max=n_steps, description="step", continuous_update=False, style=style),
        **model_controls(params),
        "dp": w.SelectionSlider(options=POWERS_OF_TWO, value=dp, description="dp", continuous_update=False,
                                style=style),
        "tp": toggles([1, 2, 4, 8], 8, "tp", "38px"),
        "pp": toggles([1, 2, 4, 8, 16], 4, "pp", "38px"),
        "cp": toggles([1, 2, 4, 8, 16], 4, "cp", "38px"),
        "microbatches": w.Dropdown(options=[1, 2, 4, 8, 16, 32], value=1, description="micro-batches",
                                   style=style, layout=w.Layout(width="170px")),
        "element": toggles([("16-bit", 2), ("fp32", 4)], bytes_per_element, "gradients in", "66px"),
    }
    w.jslink((controls["play"], "value"), (controls["step"], "value"))

    def links(app: WidgetApp) -> None:
        link_model_preset(app)

        def resize(_):  # a new collective or ring size restarts the stepping at 0
            total = len(ring_steps(app.controls["op"].value, app.controls["ranks"].value))
            with app.batch():
                for name in ("step", "play"):
                    app.controls[name].value = 0
                    app.controls[name].max = total
        app.controls["op"].observe(resize, names="value")
        app.controls["ranks"].observe(resize, names="value")

    sections = [Section("One collective, step by step", _collective_drawer(), ("op", "ranks", "size", "step"),
                        [["op"], ["ranks", "size", "play", "step"]]),
                Section("One training step, per strategy", _strategy_drawer(measured),
                        ("params", "dp", "tp", "pp", "cp", "microbatches", "element"),
                        [["preset", "params", "microbatches", "element"], ["dp", "tp", "pp", "cp"]])]
    return WidgetApp("traffic", controls, sections, links=links)
