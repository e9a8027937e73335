"""The widgets, headless (Agg): moving a control redraws the figure, and what the figure shows is the theory's
number — bar heights are ``estimate_memory``'s bytes, the bubble text is the formula, bytes are
``step_traffic``'s — and a bad value shows a message in the widget instead of raising."""
from __future__ import annotations

import base64

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402

from partrain_edu.theory import estimate_memory, plan, step_traffic  # noqa: E402
from partrain_edu.theory.ring_steps import RING_OPS, bytes_sent_per_rank, ring_steps, states  # noqa: E402
from partrain_edu.theory.schedules import build_schedule, simulate  # noqa: E402
from partrain_edu.theory.traffic import ring_bytes_sent  # noqa: E402
from partrain_edu.viz import (  # noqa: E402
    bubble_formula,
    collective_figure,
    inflight_curves,
    memory_widget,
    pipeline_figure,
    pipeline_widget,
    planner_widget,
    traffic_widget,
)
from partrain_edu.viz.palette import IDLE  # noqa: E402
from partrain_edu.viz.planner import layout_memory  # noqa: E402


def texts(fig) -> str:
    """Every string drawn on the figure (titles, labels, annotations), one per line."""
    found = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    return "\n".join(found)


def stacked_bars(fig) -> dict[str, list[float]]:
    """{legend label: bar heights in GB} of the memory figure's stacked bars."""
    ax = fig.axes[0]
    return {c.get_label(): [bar.get_height() for bar in c] for c in ax.containers}


def shown_png(app, section=0) -> bytes:
    return base64.b64decode(app.sections[section].output.outputs[0]["data"]["image/png"])


# ---- the ring model behind the traffic widget ----

@pytest.mark.parametrize("op", RING_OPS)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8])
def test_ring_steps_add_up_to_the_ring_cost_model_and_finish_the_collective(op, n):
    payload = 1_000_003  # not divisible by n: the rounding must match too
    same_cost = "all_gather" if op == "all_to_all" else op  # all-to-all sends (n−1)/n · S like an all-gather
    assert max(bytes_sent_per_rank(op, n, payload)) == ring_bytes_sent(same_cost, payload, n)
    final = states(op, n)[-1]
    everyone = frozenset(range(n))
    expected = {"all_reduce": lambda r, c: everyone, "reduce_scatter": lambda r, c: everyone if c == r else None,
                "all_gather": lambda r, c: {c}, "broadcast": lambda r, c: {0}, "all_to_all": lambda r, c: {c}}[op]
    for r in range(n):
        for c in range(n):
            if expected(r, c) is not None:
                assert final[r][c] == expected(r, c), (op, n, r, c)
    for step in ring_steps(op, n):
        senders = [t.src for t in step]
        assert len(senders) == len(set(senders))  # a rank sends at most one chunk per step
        if op != "all_to_all":
            assert all(t.dst == (t.src + 1) % n for t in step)  # a ring: only to the right neighbour


# ---- memory ----

def test_memory_widget_opens_on_the_notes_example_120_gb_against_80():
    app = memory_widget()
    bars = stacked_bars(app.figure)
    assert [bars[k][0] for k in ("parameters", "gradients", "optimizer states")] == [15.0, 15.0, 90.0]
    assert "activations" not in bars  # no micro-batch given: activations are not drawn
    assert "120.0 GB" in texts(app.figure) and "80 GB\ndevice" in texts(app.figure)
    line = [ln for ln in app.figure.axes[0].lines if ln.get_linestyle() == "--"][0]
    assert line.get_ydata()[0] == 80.0
    assert "needs 120.0 GB per device" in app.message and "out of memory" in app.message
    assert repr(app) == "<memory widget>"
    assert shown_png(app).startswith(b"\x89PNG")


def test_memory_bars_equal_estimate_memory_when_controls_move():
    app = memory_widget()
    before = shown_png(app)
    with app.batch():
        app.controls["dp"].value = 64
        app.controls["zero"].value = 3
        app.controls["micro_batch"].value = 2
        app.controls["recompute"].value = "selective"
    assert shown_png(app) != before
    bars = stacked_bars(app.figure)
    for z in range(4):
        e = estimate_memory(7_500_000_000, dp=64, zero=z, layers=36, hidden=4096, heads=32, seq=2048,
                            micro_batch=2, recompute="selective")
        for label, value in (("parameters", e.params_bytes), ("gradients", e.grads_bytes),
                             ("optimizer states", e.optimizer_bytes), ("activations", e.activations_bytes)):
            assert bars[label][z] == pytest.approx(value / 1e9, rel=1e-12), (z, label)
    assert "ZeRO-3" in app.message and "fits" in app.message


@pytest.mark.parametrize("device,dp,fitting", [
    ("80 GB", 64, "ZeRO-1, ZeRO-2 and ZeRO-3 fit."),   # 31.4, 16.6 and 1.9 GB of 80; DDP's 120 does not
    ("24 GB", 64, "ZeRO-2 and ZeRO-3 fit."),           # ZeRO-1's 31.4 GB does not fit in 24
    ("24 GB", 8, "ZeRO-3 fits."),                      # 41.3, 28.1 and 15 GB
])
def test_memory_widget_names_the_stages_that_fit_as_an_english_list(device, dp, fitting):
    app = memory_widget()
    with app.batch():
        app.controls["device"].value, app.controls["dp"].value = device, dp
    assert app.message.endswith("; " + fitting), app.message


def test_memory_widget_preset_fills_the_size_and_bad_values_show_a_message():
    app = memory_widget()
    app.controls["preset"].value = "175B (GPT-3)"
    assert app.controls["params"].value == "175B"
    assert stacked_bars(app.figure)["optimizer states"][0] == pytest.approx(175e9 * 12 / 1e9)
    good = app.figure
    app.controls["params"].value = "seven billion"
    assert "cannot read 'seven billion' as a size" in app.message
    assert app.figure is good  # the last valid figure stays
    app.controls["params"].value = "13B"            # 40 layers in the assumed shape …
    with app.batch():
        app.controls["micro_batch"].value = 1
        app.controls["pp"].value = 16               # … do not split over 16 stages
    assert "not divisible by --pp 16" in app.message
    app.controls["pp"].value = 8
    assert app.sections[0].error == "" and "13B parameters" in texts(app.figure)


# ---- pipeline ----

@pytest.mark.parametrize("name,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 16, 64, 1),
                                        ("interleaved", 4, 8, 2), ("naive", 4, 8, 1), ("zb-h1", 4, 8, 1)])
def test_pipeline_bubble_text_equals_the_formula_and_the_simulator(name, p, m, v):
    app = pipeline_widget()
    with app.batch():
        app.controls["stages"].value = p
        app.controls["microbatches"].value = m
        app.controls["schedule"].value = name
        app.controls["chunks"].value = max(v, 2)
    costs = (app.controls["t_forward"].value, app.controls["t_backward"].value, app.controls["t_weight"].value)
    sim = simulate(build_schedule(name, p, m, v), *costs)
    formula_text, value = bubble_formula(name, p, m, v, *costs)
    title = texts(app.figure)
    assert f"bubble {100 * sim.bubble_fraction:.1f} %" in title
    assert f"{100 * float(value):.1f} %" in title and float(value) == pytest.approx(sim.bubble_fraction)
    if name in ("gpipe", "1f1b"):
        assert f"(p−1)/(m+p−1) = {p - 1}/{m + p - 1}" in title
    assert "= the formula ✓" in app.message
    # what stays grey in the picture is the bubble: count the pixels
    image = np.asarray(app.figure.axes[0].images[0].get_array())[..., :3]
    bands = image[(image != 255).any(axis=(1, 2))]  # the stages' rows, without the white gaps between them
    grey = np.array([round(255 * c) for c in to_rgb(IDLE)])
    assert (bands == grey).all(axis=2).mean() == pytest.approx(sim.bubble_fraction, abs=0.01)


def test_pipeline_widget_switching_to_zb_h1_gives_w_a_cost_and_bad_m_shows_a_message():
    app = pipeline_widget()
    app.controls["schedule"].value = "zb-h1"
    assert (app.controls["t_backward"].value, app.controls["t_weight"].value) == (1.0, 1.0)
    assert "bubble 11.1 %" in texts(app.figure)  # 1/9 at p = 4, m = 8, F = B = W
    app.controls["schedule"].value = "interleaved"
    app.controls["microbatches"].value = 6
    assert "multiple of --stages 4" in app.message
    assert app.controls["chunks"].disabled is False


def test_pipeline_figure_draws_a_measured_timeline_with_its_own_bubble_and_peaks():
    sim = simulate(build_schedule("1f1b", 3, 5), 1, 2)
    # a "measured" run: seconds since some epoch, every action 10 % slower on rank 2
    events = [{"stage": e.stage, "microbatch": e.microbatch, "chunk": e.chunk, "kind": e.kind,
               "start": 1000.0 + 0.01 * e.start * (1.1 if e.stage == 2 else 1),
               "end": 1000.0 + 0.01 * e.end * (1.1 if e.stage == 2 else 1)} for e in sim.events]
    fig = pipeline_figure(events, title="measured", time_label="seconds", row_label="rank")
    busy = sum(e["end"] - e["start"] for e in events)
    makespan = max(e["end"] for e in events) - min(e["start"] for e in events)
    assert f"bubble {100 * (1 - busy / (3 * makespan)):.1f} %" in texts(fig)
    assert "rank 0" in texts(fig)
    with pytest.raises(ValueError, match="kind must be F, B or W"):
        pipeline_figure([{**events[0], "kind": "X"}])


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)])
def test_inflight_curves_from_events_match_the_simulator(name, v):
    sim = simulate(build_schedule(name, 4, 8, v), 1, 1, 1)
    curves = inflight_curves([(e.stage, e.microbatch, e.chunk, e.kind, e.start, e.end) for e in sim.events], 4)
    assert [max(h for _, h in c) for c in curves] == list(sim.peak_activations)
    assert [c[-1] for c in curves] == [c[-1] for c in sim.inflight]


# ---- traffic ----

def test_traffic_widget_steps_through_the_ring():
    app = traffic_widget(op="all_reduce", ranks=4)
    assert app.controls["step"].max == 6
    before = shown_png(app)
    app.controls["step"].value = 2
    assert shown_png(app) != before
    arrows = [p for p in app.figure.axes[0].patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == 4  # every rank sends one chunk per step
    assert "step 2 of 6 (reduce-scatter phase)" in texts(app.figure)
    point = [ln for ln in app.figure.axes[1].lines if ln.get_marker() == "o"][0]
    assert point.get_ydata()[0] == ring_bytes_sent("all_reduce", 10**9, 4) / 10**9  # 2(n−1)/n = 1.5
    app.controls["op"].value = "broadcast"
    assert app.controls["step"].value == 0 and app.controls["step"].max == len(ring_steps("broadcast", 4))
    app.controls["size"].value = "0"
    assert "size must be positive" in app.sections[0].error


def test_collective_figure_overlays_measured_bytes():
    fig = collective_figure("all_gather", 3, step=1, payload_bytes=300, measured={2: 150, 3: 200})
    crosses = [ln for ln in fig.axes[1].lines if ln.get_marker() == "x"][0]
    assert list(crosses.get_ydata()) == [0.5, 200 / 300]


def test_strategy_bars_equal_step_traffic_and_measured_comm_is_overlaid():
    tiny = 218_496  # TinyGPT's parameters; a 2-rank fp32 DDP run all-reduces 873,984 bytes per step
    comm = {"all_reduce": {"calls": 1, "bytes": 873_984}}
    app = traffic_widget(params=str(tiny), dp=2, bytes_per_element=4, measured={"ddp": comm, "zero3": comm})
    fig = app.sections[1].figure
    unit = {"GB": 1e9, "MB": 1e6, "KB": 1e3, "B": 1}[fig.axes[0].get_xlabel().split()[0]]
    assert unit == 1e6  # ZeRO-3 sends 1.3 MB here: drawn in MB, not as slivers of a GB
    rows = {}  # row (0 = DDP … 5 = PP) → bytes of its stacked pieces
    for bar in (b for c in fig.axes[0].containers for b in c):
        rows.setdefault(round(bar.get_y() + bar.get_height() / 2), []).append(bar.get_width() * unit)
    ddp = step_traffic("ddp", tiny, dp=2, bytes_per_element=4).per_rank_bytes_sent
    assert ddp == 873_984 and rows[0] == [pytest.approx(ddp)]
    zero3 = step_traffic("zero3", tiny, dp=2, bytes_per_element=4)
    assert rows[3] == pytest.approx([c.bytes_sent for c in zero3.collectives])
    shown = texts(fig)
    assert "measured 874.0 KB = predicted ✓" in shown
    assert "measured 874.0 KB vs 1.3 MB predicted" in shown  # a mismatch says so
    app.controls["dp"].value = 1
    assert "0 B (nothing to send at this degree)" in texts(app.sections[1].figure)


# ---- planner ----

def test_planner_widget_shows_the_plan_its_memory_and_a_message_when_nothing_fits():
    app = planner_widget(params="13B", gpus=64)
    chosen = plan(13_000_000_000, 64, 80_000_000_000)
    parts = layout_memory(chosen, 13_000_000_000)
    assert sum(parts.values()) == chosen.layout.bytes_per_device and parts["transient"] >= 0
    heights = [c[0].get_height() for c in app.figure.axes[0].containers]
    assert sum(heights) == pytest.approx(chosen.layout.bytes_per_device / 1e9)
    assert chosen.reason in app.message
    app.controls["params"].value = "175B"
    app.controls["gpus"].value = 4
    assert "fit no layout of 4 GPU(s)" in app.message
    app.controls["gpus"].value = 512
    assert app.sections[0].error == "" and "175B on 512 GPUs" in app.figure._suptitle.get_text()


def test_no_widget_raises_on_nonsense_typed_into_a_text_box():
    for make, boxes in ((memory_widget, 1), (traffic_widget, 2), (planner_widget, 1)):
        app = make()
        for control in app.controls.values():
            if control.__class__.__name__ == "Text":
                control.value = "lots"
        shown = [s.error for s in app.sections if s.error]
        assert len(shown) == boxes and all("cannot read 'lots' as a size" in e for e in shown), shown


def test_redrawing_only_the_data_gives_the_picture_a_full_draw_gives():
    """The widgets keep a figure's frame and redraw only its data (blitting); nothing stale may stay."""
    import io

    from PIL import Image

    from partrain_edu.viz import memory_figure, zero_stage_estimates
    from partrain_edu.viz import pipeline as pipeline_module
    from partrain_edu.viz._app import render_png

    def pixels(png: bytes) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int)

    def differing(a: bytes, b: bytes) -> float:
        a, b = pixels(a), pixels(b)
        assert a.shape == b.shape
        return float((np.abs(a - b).max(axis=2) > 40).mean())

    app = memory_widget()
    app.controls["zero"].value = 2
    app.controls["dp"].value = 64   # the frame is kept: only bars, labels and the line are redrawn
    full = render_png(memory_figure(zero_stage_estimates("7.5B", dp=64), selected=2, dp=64,
                                    title=texts(app.figure).splitlines()[-1]))
    assert differing(app.sections[0].png, full) < 0.002  # (where a bar meets the axis line, order differs)

    pipe = pipeline_widget()
    pipe.controls["microbatches"].value = 12  # same stages: the frame is kept
    fig, _ = pipeline_module._draw(pipe.values())
    assert differing(pipe.sections[0].png, render_png(fig)) < 0.002
