"""The thin layer between the figures and ipywidgets: controls → a figure rendered into an ``Output`` widget.

Every widget of the course is a :class:`WidgetApp`: rows of controls, then one or more *sections*, each a
``draw(values) -> (Figure, sentence)`` function, a line of text and an ``Output`` that shows the figure. When a
control changes, the sections that watch it redraw. A bad value (a ``ValueError`` from the theory layer,
whose message names the fix) shows as a red line in the widget, never as a traceback; the last good figure
stays.

Why we render the PNG ourselves instead of ``display(fig)`` through the inline backend: one Agg draw per
redraw (the inline backend's ``bbox_inches="tight"`` draws twice), the Output's content is replaced in one
assignment (no flicker, no pile of old figures), and it behaves the same under any backend (inline, ipympl)
and without a kernel at all — which is how the tests drive it.
"""

from __future__ import annotations

import base64
import contextlib
import html
from dataclasses import dataclass, field
from typing import Callable

import ipywidgets as w
from matplotlib.figure import Figure

from partrain_edu.viz._render import render_png
from partrain_edu.viz.palette import OVER

# Model-size presets shared by the widgets: the source notes' 7.5B example and well-known sizes.
MODEL_PRESETS = {"GPT-2 1.5B": "1.5B", "7.5B (the notes' example)": "7.5B", "13B": "13B", "70B": "70B",
                 "175B (GPT-3)": "175B"}
DEVICE_MEMORY = ["24 GB", "40 GB", "80 GB", "141 GB"]  # the sizes of common GPUs (RTX 4090, A100, H100, H200)
POWERS_OF_TWO = [2**k for k in range(11)]  # 1 … 1024


def show_png(output: w.Output, png: bytes, alt: str) -> None:
    """Replace what ``output`` shows with the image, in one step."""
    output.outputs = ({"output_type": "display_data", "metadata": {},
                       "data": {"image/png": base64.b64encode(png).decode("ascii"), "text/plain": alt}},)


@dataclass
class Section:
    """One figure of a widget: redrawn by ``draw`` whenever a control named in ``watch`` changes."""

    title: str
    draw: Callable[[dict], tuple]   # values → (Figure, sentence) or (Figure, sentence, PNG bytes)
    watch: tuple[str, ...]
    rows: list[list[str]] = field(default_factory=list)   # the controls shown above this section's figure
    output: w.Output = field(default_factory=w.Output)
    message: w.HTML = field(default_factory=w.HTML)
    figure: Figure | None = None
    sentence: str = ""
    error: str = ""
    png: bytes = b""
    drawn: dict | None = None   # the values the figure was drawn for (a redraw with the same values is skipped)


class WidgetApp(w.VBox):
    """Controls plus sections; ``app.controls[name].value = …`` redraws exactly as moving it in the page does."""

    def __init__(self, name: str, controls: dict[str, w.Widget], sections: list[Section], *,
                 intro: str = "", links: Callable[["WidgetApp"], None] | None = None):
        self.name = name
        self.controls = controls
        self.sections = sections
        self._held = 0
        children = [w.HTML(f"<b>{html.escape(intro)}</b>")] if intro else []
        for section in sections:
            if section.title:
                children.append(w.HTML(f"<h4 style='margin:6px 0 2px 0'>{html.escape(section.title)}</h4>"))
            children += [w.HBox([_labelled(controls[c]) for c in row],
                                layout=w.Layout(flex_flow="row wrap", align_items="center"))
                         for row in section.rows]
            children += [section.message, section.output]
        super().__init__(children)
        self.add_class(f"partrain-{name}")
        if links:
            links(self)  # widget-specific wiring (a preset filling a text box, enabling a control…)
        for section in sections:
            for c in section.watch:
                controls[c].observe(lambda change, s=section: self.refresh(s), names="value")
            self.refresh(section)

    def values(self) -> dict:
        return {name: control.value for name, control in self.controls.items() if hasattr(control, "value")}

    @contextlib.contextmanager
    def batch(self):
        """Change several controls, redraw once (at the end)."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held:
                for section in self.sections:
                    self.refresh(section)

    def refresh(self, section: Section) -> None:
        values = self.values()
        watched = {name: values[name] for name in section.watch}
        if self._held or watched == section.drawn:
            return
        section.drawn = watched
        try:
            fig, sentence, *png = section.draw(values)
            png = png[0] if png else render_png(fig)
        except Exception as error:  # noqa: BLE001 - a widget shows the problem, never a traceback
            text = str(error).strip() or type(error).__name__
            if not isinstance(error, ValueError):  # not the theory layer's own message: say what it was
                text = f"unexpected {type(error).__name__}: {text}"
            section.error = text
            section.message.value = (f"<span style='color:{OVER}'>⚠ {html.escape(text)}</span>"
                                     + (" <i>(the figure shows the last valid setting)</i>" if section.png else ""))
            return
        section.error = ""
        section.sentence = sentence
        section.png = png
        section.figure = fig
        show_png(section.output, png, f"{self.name} figure")  # the picture first: the page gets it before the words
        section.message.value = f"<span style='font-size:1.05em'>{sentence}</span>"

    # the first section, for widgets that have one
    @property
    def figure(self) -> Figure | None:
        return self.sections[0].figure

    @property
    def message(self) -> str:
        section = self.sections[0]
        return section.error or section.sentence

    def __repr__(self) -> str:  # the notebook's text/plain: short and the same on every run
        return f"<{self.name} widget>"


def toggles(options, value, description: str, width: str = "58px", **kw) -> w.ToggleButtons:
    """Compact toggle buttons (small sets of choices read better as buttons than as a dropdown);
    ``width`` is each button's."""
    return w.ToggleButtons(options=options, value=value, description=description, layout=w.Layout(width="auto"),
                           style={"button_width": width, "description_width": "initial"}, **kw)


def _labelled(control: w.Widget) -> w.Widget:
    """Toggle buttons with their label on the same line: ipywidgets puts a ToggleButtons' own description
    above the buttons once the row wraps, so the label becomes a separate widget in front of them."""
    if not isinstance(control, w.ToggleButtons) or not control.description:
        return control
    label = w.Label(control.description, layout=w.Layout(margin="0 4px 0 8px"))
    control.description = ""
    return w.HBox([label, control], layout=w.Layout(align_items="center"))


OTHER = "other (type a size →)"


def model_controls(size: str = "7.5B") -> dict[str, w.Widget]:
    """A preset dropdown plus a free-entry box (7.5e9, 7.5B, 350M): the model size of several widgets."""
    preset = next((name for name, value in MODEL_PRESETS.items() if value == size), OTHER)
    return {"preset": w.Dropdown(options=list(MODEL_PRESETS) + [OTHER], value=preset,
                                 description="model", style={"description_width": "initial"},
                                 layout=w.Layout(width="250px")),
            "params": w.Text(value=size, description="parameters",
                             continuous_update=False, style={"description_width": "initial"},
                             layout=w.Layout(width="170px"))}


def link_model_preset(app: WidgetApp) -> None:
    """Choosing a preset types its size into the parameters box (which is what the figures read)."""
    preset, params = app.controls["preset"], app.controls["params"]

    def chosen(change):
        if change["new"] in MODEL_PRESETS:
            params.value = MODEL_PRESETS[change["new"]]

    def typed(change):
        match = [k for k, v in MODEL_PRESETS.items() if v == change["new"]]
        preset.value = match[0] if match else OTHER

    preset.observe(chosen, names="value")
    params.observe(typed, names="value")
