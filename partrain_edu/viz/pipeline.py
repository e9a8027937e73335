"""Pipeline bubbles (气泡) as a picture: a schedule's timeline, its bubble beside the formula, and the
activations each stage holds over time.

    from partrain_edu.viz import pipeline_widget
    pipeline_widget()        # 1F1B, p = 4 stages, m = 8 micro-batches: bubble (p−1)/(m+p−1) = 3/11

:func:`pipeline_figure` draws any timeline whose events have the ``partrain-edu pipeline --json`` shape,
``{"stage", "microbatch", "chunk", "kind", "start", "end"}``: one simulated by ``theory.schedules.simulate``
(time in units of one forward) or one *measured* from a real run (seconds, a row per rank), so prediction
and measurement are read the same way. Grey is idle time — the bubble. The bubble fraction is idle
stage-time / (p × makespan), as in the simulator; for p stages and m micro-batches of equal cost it is
(p−1)/(m+p−1) for GPipe and 1F1B (Huang et al. 2019; Narayanan et al. 2021), (p−1)/(v·m+p−1) interleaved
over v chunks, and (p−1)(F+B−W) / (m(F+B+W) + (p−1)(F+B−W)) for ZB-H1 (Qi et al. 2024).
"""

from __future__ import annotations

import functools

import ipywidgets as w
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from partrain_edu.theory.schedules import SimResult, bubble_formula, build_schedule, simulate
from partrain_edu.viz._app import Section, WidgetApp, toggles
from partrain_edu.viz._render import DPI, Layered
from partrain_edu.viz.palette import BACKWARD, FORWARD, IDLE, INK, WEIGHT_GRAD, clean, lighten

KIND_COLORS = {"F": FORWARD, "B": BACKWARD, "W": WEIGHT_GRAD}
KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
SCHEDULE_NAMES = {"naive": "naive (whole batch)", "gpipe": "GPipe", "1f1b": "1F1B",
                  "interleaved": "interleaved 1F1B", "zb-h1": "ZB-H1 (zero bubble)"}
LEFT, RIGHT = 0.07, 0.93  # axes position in figure widths (fixed: no tight_layout on every redraw)


def _events(timeline) -> list[tuple[int, int, int, str, float, float]]:
    """(stage, microbatch, chunk, kind, start, end) from a SimResult or from events (objects or dicts)."""
    if isinstance(timeline, SimResult):  # the simulator's own events need no checking
        return [(e.stage, e.microbatch, e.chunk, e.kind, e.start, e.end) for e in timeline.events]
    events, out = timeline, []
    for e in events:
        get = e.get if isinstance(e, dict) else (lambda key, default=None, e=e: getattr(e, key, default))
        try:
            row = (int(get("stage")), int(get("microbatch")), int(get("chunk", 0) or 0), str(get("kind")),
                   float(get("start")), float(get("end")))
        except (TypeError, ValueError):
            raise ValueError("each event needs stage, microbatch, kind, start and end (chunk optional), "
                             f"got {e!r}") from None
        if row[3] not in KIND_COLORS or row[5] < row[4] or row[0] < 0:
            raise ValueError(f"event {e!r}: kind must be F, B or W, end >= start and stage >= 0")
        out.append(row)
    if not out:
        raise ValueError("the timeline has no events; give a SimResult or a list of event dicts")
    return out


def inflight_curves(events, stages: int) -> list[list[tuple[float, int]]]:
    """Per stage, (time, micro-batch activations held) steps: +1 when a forward starts, −1 when the action
    that frees them ends (W where the stage runs W's, else B); frees first on ties, as the simulator."""
    curves = []
    for s in range(stages):
        mine = [e for e in events if e[0] == s]
        frees = "W" if any(e[3] == "W" for e in mine) else "B"
        steps = sorted([(e[4], 1, 1) for e in mine if e[3] == "F"] + [(e[5], 0, -1) for e in mine if e[3] == frees])
        held, curve = 0, [(0.0, 0)]
        for t, _, delta in steps:
            held += delta
            curve.append((t, held))
        curves.append(curve)
    return curves


ROW_PX = 8  # image rows per stage: a 1-row white gap above and below (imshow stretches them to the axes)


def _rgba(color) -> np.ndarray:
    return np.array([round(255 * c) for c in to_rgb(color)] + [255], dtype=np.uint8)


def _gantt_pixels(events, stages: int, width: int, chunks: int, scale: float) -> np.ndarray:
    """(stages·ROW_PX, width, 4) image: a grey band per stage (idle), each action's box over it in its
    kind's colour (lighter for later chunks), a white pixel column where a box starts."""
    img = np.full((stages * ROW_PX, width, 4), 255, dtype=np.uint8)  # uint8 RGBA: what Agg draws fastest
    gap = ROW_PX // 8
    for s in range(stages):
        img[s * ROW_PX + gap:(s + 1) * ROW_PX - gap] = _rgba(IDLE)
    colors = {(k, c): _rgba(lighten(KIND_COLORS[k], 0.5 * c / max(chunks - 1, 1))) for k in KIND_COLORS
              for c in range(chunks)}
    for s, _, c, k, a, b in events:
        x0, x1 = int(a * scale), max(int(a * scale) + 1, int(b * scale))
        band = img[s * ROW_PX + gap:(s + 1) * ROW_PX - gap]
        band[:, x0:x1] = colors[k, c]
        if x1 - x0 >= 3:
            band[:, x0, :3] = 255  # a thin white line between neighbouring boxes
    return img


def _inflight_pixels(curves, width: int, scale: float, peak: int, cmap) -> np.ndarray:
    """(stages, width, 4) image: per stage, the activations held at each pixel column, as a shade."""
    centres = (np.arange(width) + 0.5) / scale   # the time at each pixel column
    rows = []
    for curve in curves:
        times = np.array([t for t, _ in curve])
        held = np.array([h for _, h in curve])[np.searchsorted(times, centres, side="right") - 1]
        shade = cmap(0.2 + 0.8 * held / peak, bytes=True)   # uint8 RGBA
        shade[held == 0] = 255
        rows.append(shade[None])
    return np.concatenate(rows)


class _Timeline:
    """A timeline made ready to draw: events shifted to start at 0, the bubble, in-flight curves."""

    def __init__(self, timeline, stages: int | None = None):
        events = _events(timeline)
        self.p = stages or max(e[0] for e in events) + 1
        t0 = min(e[4] for e in events)
        self.events = [(s, mb, c, k, a - t0, b - t0) for s, mb, c, k, a, b in events]
        self.makespan = max(e[5] for e in self.events) or 1.0
        self.bubble = 1 - sum(e[5] - e[4] for e in self.events) / (self.p * self.makespan)
        self.chunks = max(e[2] for e in self.events) + 1
        self.kinds = tuple(k for k in KIND_COLORS if any(e[3] == k for e in self.events))
        self.curves = ([list(c) for c in timeline.inflight] if isinstance(timeline, SimResult) and t0 == 0
                       else inflight_curves(self.events, self.p))

    def frame_key(self, row_label: str, time_label: str) -> tuple:
        return self.p, self.kinds, self.chunks, row_label, time_label


def _heights(p: int) -> tuple[float, float, float]:
    g_h, a_h = max(1.5, min(0.3 * p, 3.2)), max(0.8, min(0.14 * p, 1.2))  # inches: rows shrink as p grows
    return g_h, a_h, g_h + a_h + 1.55


def _ticks(p: int) -> list[int]:
    return sorted(set(range(0, p, 1 if p <= 8 else 4)) | {p - 1})


def pipeline_figure(timeline, *, stages: int | None = None, title: str = "", formula: str = "",
                    time_label: str = "time (one forward of a micro-batch through a stage = 1)",
                    row_label: str = "stage") -> Figure:
    """Gantt chart (a row per stage: F/B/W boxes numbered by micro-batch, grey = bubble) above a strip of
    the activations each stage holds over time (darker = more; its peak on the right)."""
    tl = _Timeline(timeline, stages)
    fig = _frame(tl, row_label, time_label)
    _data(fig, tl, title, formula, row_label)
    return fig


def _frame(tl: _Timeline, row_label: str, time_label: str) -> Figure:
    """What depends only on the number of stages and the kinds of work: axes, stage names, legend."""
    p, (g_h, a_h, height) = tl.p, _heights(tl.p)
    fig, (gantt, strip) = plt.subplots(2, 1, figsize=(11, height), sharex=True,
                                       gridspec_kw={"height_ratios": [g_h, a_h], "hspace": 0.12})
    fig.subplots_adjust(left=LEFT, right=RIGHT, top=1 - 0.85 / height, bottom=0.55 / height)
    ticks = _ticks(p)
    gantt.set_yticks(ticks, [f"{row_label} {s}" for s in ticks], fontsize=9)
    names = {**KIND_NAMES, "B": "input gradient"} if "W" in tl.kinds else KIND_NAMES  # B without W (zero bubble)
    handles = ([Patch(color=KIND_COLORS[k], label=names[k]) for k in tl.kinds]
               + [Patch(color=IDLE, label="idle (bubble)")])
    if tl.chunks > 1:
        handles.append(Patch(color=lighten(FORWARD, 0.5), label=f"lighter = later chunk (of {tl.chunks})"))
    gantt.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles), frameon=False,
                 fontsize=9, handlelength=1.2, borderaxespad=0.2)
    clean(gantt, keep=())
    gantt.tick_params(length=0)
    gantt.xaxis.set_visible(False)  # the strip below carries the time axis
    strip.set_yticks([])
    strip.set_ylabel(f"activations\nheld per\n{row_label}", fontsize=8.5)
    strip.set_xlabel(time_label, fontsize=9)
    clean(strip, keep=("bottom",))
    for ax in (gantt, strip):
        ax.set_ylim(p - 0.5, -0.5)
    return fig


def _data(fig: Figure, tl: _Timeline, title: str, formula: str, row_label: str) -> list:
    """The timeline itself: both pictures, the numbers on them, the time axis and the heading."""
    gantt, strip = fig.axes
    p, makespan = tl.p, tl.makespan
    strip.set_xlim(0, makespan)
    # Drawn as pixels (an image as wide as the axes), not as one rectangle per action: the cost stays the
    # same for 2 or 4000 actions, so the widget redraws as fast at p = 16, m = 64 as at p = 4, m = 8.
    width = round(fig.get_figwidth() * DPI * (RIGHT - LEFT))
    scale = width / makespan
    extent = (0, makespan, p - 0.5, -0.5)
    added = [gantt.imshow(_gantt_pixels(tl.events, p, width, tl.chunks, scale), extent=extent, aspect="auto",
                          interpolation="nearest")]
    labels = [(s, mb, c, a, b) for s, mb, c, _, a, b in tl.events if (b - a) * scale >= 7 * len(str(mb)) + 5]
    if len(labels) <= 600 and 0.76 * DPI * _heights(p)[0] / p >= 11:  # numbers only where they are readable
        for s, mb, c, a, b in labels:  # white on the full colours, dark on a later chunk's lighter shade
            added.append(gantt.text((a + b) / 2, s, str(mb), ha="center", va="center", fontsize=8,
                                    color="white" if c == 0 else INK))
    peaks = [max(h for _, h in curve) for curve in tl.curves]
    added.append(strip.imshow(_inflight_pixels(tl.curves, width, scale, max(peaks) or 1, plt.get_cmap("Purples")),
                              extent=extent, aspect="auto", interpolation="nearest"))
    for s in _ticks(p) if p > 8 else range(p):  # each stage's peak, at the end of its row
        added.append(strip.text(makespan * 1.005, s, f"{s}: {peaks[s]}" if p > 8 else str(peaks[s]),
                                va="center", fontsize=8, color=INK))
    added.append(strip.text(1.005, 1.04, "peak", transform=strip.transAxes, fontsize=8, color=INK, va="bottom"))
    heading = (title or f"{p} {row_label}s, makespan {makespan:.4g}") + f" — bubble {100 * tl.bubble:.1f} %"
    added.append(fig.text(0.5, 0.995, heading + (f"\n{formula}" if formula else ""), ha="center", va="top",
                          fontsize=11))
    added.append(strip.xaxis)  # its ticks follow the makespan: redrawn with the data, never removed
    return added


def _draw(v: dict, painter: Layered | None = None) -> tuple:
    p = v["stages"]
    m = v["microbatches"]
    name = v["schedule"]
    chunks = v["chunks"] if name == "interleaved" else 1
    costs = [1.0] * (p - 1) + [v["last_stage"]] if v["last_stage"] != 1 else None
    result = simulate(build_schedule(name, p, m, chunks), v["t_forward"], v["t_backward"], v["t_weight"], costs)
    formula = bubble_formula(name, p, m, chunks, v["t_forward"], v["t_backward"], v["t_weight"])
    if formula is None:
        line, verdict = "no closed form for these settings", ""
    else:
        text, value = formula
        exact = "" if value.denominator > 1000 or "/" not in text.rsplit("=", 1)[-1] else f" = {value}"
        line = f"formula {text.split(' = ')[0]}{exact} = {100 * float(value):.1f} %" + (
            " for equal stages (the last stage is slower here)" if costs else "")
        verdict = "" if costs else (" = the formula ✓" if abs(float(value) - result.bubble_fraction) < 1e-9
                                    else f" ≠ formula {100 * float(value):.1f} %")
    title = f"{SCHEDULE_NAMES[name]}: p = {p} stages, m = {m} micro-batches" + (f", v = {chunks}" if chunks > 1 else "")
    tl = _Timeline(result, p)
    args = ("stage", "time (one forward of a micro-batch through a stage = 1)")
    if painter is None:
        fig, png = pipeline_figure(result, stages=p, title=title, formula=line), None
    else:  # the widget: the frame is kept while p and the kinds of work stay the same
        fig, png = painter.paint(tl.frame_key(*args), lambda: _frame(tl, *args),
                                 lambda fig: _data(fig, tl, title, line, "stage"))
    peaks = ", ".join(map(str, result.peak_activations[:8])) + (" …" if p > 8 else "")
    sentence = (f"Bubble <b>{100 * result.bubble_fraction:.1f} %</b> (simulated){verdict}. Activations held at "
                f"the peak, per stage: {peaks} micro-batches" + (" (counted per chunk)." if chunks > 1 else "."))
    return (fig, sentence) if png is None else (fig, sentence, png)


def pipeline_widget(stages: int = 4, microbatches: int = 8, schedule: str = "1f1b") -> WidgetApp:
    """Stages, micro-batches, schedule and costs → the simulated timeline (``partrain-edu pipeline``)."""
    style = {"description_width": "initial"}
    slider = dict(continuous_update=False, style=style, layout=w.Layout(width="380px"))
    cost = dict(min=0.0, max=3.0, step=0.25, readout_format=".2f", **slider)
    controls = {
        "stages": w.IntSlider(stages, min=1, max=16, description="stages p", **slider),
        "microbatches": w.IntSlider(microbatches, min=1, max=64, description="micro-batches m", **slider),
        "schedule": w.Dropdown(options=[(label, key) for key, label in SCHEDULE_NAMES.items()], value=schedule,
                               description="schedule", style=style, layout=w.Layout(width="270px")),
        "chunks": toggles([2, 3, 4], 2, "chunks v (interleaved)", "38px"),
        "t_forward": w.FloatSlider(1.0, description="cost F", **cost),
        "t_backward": w.FloatSlider(2.0, description="cost B", **cost),
        "t_weight": w.FloatSlider(0.0, description="cost W", **cost),
        "last_stage": w.FloatSlider(1.0, min=1.0, max=2.0, step=0.1, description="last stage slower ×",
                                    readout_format=".1f", **slider),
    }

    def links(app: WidgetApp) -> None:
        def schedule_changed(change):
            app.controls["chunks"].disabled = change["new"] != "interleaved"
            if change["new"] == "zb-h1" and app.controls["t_weight"].value == 0:
                # ZB-H1 splits the backward into B (input gradient) and W (weight gradient): give W a cost
                with app.batch():
                    app.controls["t_backward"].value, app.controls["t_weight"].value = 1.0, 1.0
        app.controls["schedule"].observe(schedule_changed, names="value")
        app.controls["chunks"].disabled = schedule != "interleaved"

    rows = [["stages", "microbatches", "schedule", "chunks"], ["t_forward", "t_backward", "t_weight", "last_stage"]]
    draw = functools.partial(_draw, painter=Layered())  # one painter per widget: it keeps that widget's frame
    return WidgetApp("pipeline", controls, [Section("", draw, tuple(controls), rows)], links=links)
