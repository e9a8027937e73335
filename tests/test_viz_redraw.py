"""The widgets redraw only what changed (``viz._render.Layered``): the frame is kept and the data drawn over
it. These tests make sure the shortcut never freezes a widget — after each move the artists hold the new
values, and nothing from the last drawing is left behind — and that the picture equals a full draw."""
from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_rgba_array  # noqa: E402
from matplotlib.patches import FancyArrowPatch  # noqa: E402
from PIL import Image  # noqa: E402

from partrain_edu.theory import plan, step_traffic  # noqa: E402
from partrain_edu.theory.planner import assumed_shape  # noqa: E402
from partrain_edu.theory.ring_steps import ring_steps, states  # noqa: E402
from partrain_edu.theory.schedules import build_schedule, simulate  # noqa: E402
from partrain_edu.viz import (  # noqa: E402
    collective_figure,
    memory_figure,
    memory_widget,
    pipeline_widget,
    planner_figure,
    planner_widget,
    strategy_traffic,
    strategy_traffic_figure,
    traffic_widget,
    zero_stage_estimates,
)
from partrain_edu.viz import pipeline as pipeline_module  # noqa: E402
from partrain_edu.viz._render import Layered, render_png  # noqa: E402
from partrain_edu.viz.palette import ACTIVATIONS, rank_color  # noqa: E402
from partrain_edu.viz.planner import layout_memory, layout_traffic  # noqa: E402
from partrain_edu.viz.ring import collective_data, collective_frame  # noqa: E402


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]


def differing(a: bytes, b: bytes) -> float:
    """Share of pixels that differ visibly between two PNGs of the same size."""
    a, b = (np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=int) for png in (a, b))
    assert a.shape == b.shape
    return float((np.abs(a - b).max(axis=2) > 40).mean())


def test_memory_redraw_moves_bars_outline_and_scale():
    app = memory_widget()
    fig = app.figure
    app.controls["dp"].value = 8      # data only
    app.controls["zero"].value = 2
    assert app.figure is fig          # the frame was kept …
    ax = fig.axes[0]
    estimates = zero_stage_estimates("7.5B", dp=8)
    bars = {c.get_label(): [b.get_height() for b in c] for c in ax.containers}
    assert len(ax.containers) == 3    # … and the last drawing's bars are gone
    assert bars["optimizer states"] == pytest.approx([e.optimizer_bytes / 1e9 for e in estimates])
    assert [b.get_alpha() for b in ax.containers[0]] == [0.4, 0.4, 1.0, 0.4]
    assert [p.get_x() for p in ax.patches if not p.get_fill()] == [pytest.approx(2 - 0.36)]
    assert "data parallel dp = 8: ZeRO shards over 8 devices" in texts(fig)
    app.controls["params"].value = "13B"   # the scale and the title
    app.controls["device"].value = "40 GB"
    top = max(e.total_bytes for e in zero_stage_estimates("13B", dp=8)) / 1e9 * 1.2
    assert ax.get_ylim() == pytest.approx((0, top))
    assert fig.get_suptitle().startswith("13B parameters")
    assert "40 GB\ndevice" in texts(fig) and "80 GB\ndevice" not in texts(fig)
    assert [ln.get_ydata()[0] for ln in ax.lines] == [40.0]


def test_pipeline_redraw_draws_the_new_timeline():
    app = pipeline_widget()
    fig = app.figure
    app.controls["t_forward"].value = 1.5
    assert app.figure is fig
    sim = simulate(build_schedule("1f1b", 4, 8), 1.5, 2.0, 0.0)
    gantt, strip = fig.axes
    assert len(gantt.images) == 1 and gantt.images[0].get_extent()[1] == pytest.approx(sim.makespan)
    assert strip.get_xlim() == pytest.approx((0, sim.makespan))
    assert any(f"bubble {100 * sim.bubble_fraction:.1f} %" in t for t in texts(fig))


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_collective_redraw_shows_the_new_step(op):
    app = traffic_widget(op=op, ranks=4)
    total = len(ring_steps(op, 4))
    for step in (1, total, 2):
        app.controls["step"].value = step
        ax = app.figure.axes[0]
        stripes = ax.collections[0]
        want = [rank_color(j) if j in holds else "white" for row in states(op, 4)[step] for holds in row
                for j in range(4)]
        assert len(ax.collections) == 2   # stripes and cell outlines, none left from the last step
        np.testing.assert_allclose(stripes.get_facecolor(), to_rgba_array(want))
        arrows = [p for p in ax.patches if isinstance(p, FancyArrowPatch)]
        assert len(arrows) == len(ring_steps(op, 4)[step - 1])
        assert sum(t.startswith(f"step {step} of {total}") for t in texts(app.figure)) == 1


def test_strategy_redraw_shows_the_new_degrees():
    app = traffic_widget()
    fig = app.sections[1].figure
    app.controls["dp"].value = 64
    assert app.sections[1].figure is fig
    bars = fig.axes[0]
    assert len(bars.containers) == 1 and len(bars.get_legend().get_texts()) == 3
    ddp = step_traffic("ddp", 7_500_000_000, dp=64).per_rank_bytes_sent
    assert bars.containers[0][0].get_width() == pytest.approx(ddp / 1e9)
    assert bars.get_yticklabels()[0].get_text() == "DDP (dp=64)"


def test_cp_row_equals_step_traffic_and_its_control_redraws_it():
    app = traffic_widget()
    fig = app.sections[1].figure
    shape = assumed_shape(7_500_000_000)
    for cp in (16, 2):
        app.controls["cp"].value = cp
        assert app.sections[1].figure is fig
        bars = fig.axes[0]
        row = [b for b in bars.containers[0] if round(b.get_y() + b.get_height() / 2) == 6]   # 0 = DDP … 6 = CP
        ring = step_traffic("cp", cp=cp, layers=shape.layers, hidden=shape.hidden, seq=2048, micro_batch=1,
                            microbatches=1, bytes_per_element=2)
        assert [b.get_width() * 1e9 for b in row] == pytest.approx([c.bytes_sent for c in ring.collectives])
        assert [c.op for c in ring.collectives] == ["send"]        # K and V blocks: activations, point to point
        assert list(row[0].get_facecolor()[:3]) == pytest.approx(list(to_rgba_array(ACTIVATIONS)[0][:3]))
        assert bars.get_yticklabels()[6].get_text() == f"CP (cp={cp})"
    app.controls["cp"].value = 1          # no ring: nothing to send, as TP at tp = 1
    assert "0 B (nothing to send at this degree)" in texts(fig) and bars.get_yticklabels()[6].get_text() == "CP (cp=1)"


def test_planner_redraw_shows_the_new_plan():
    app = planner_widget()
    fig = app.figure
    for gpus in (128, 8):
        app.controls["gpus"].value = gpus
        assert app.figure is fig
        chosen = plan(7_500_000_000, gpus, 80 * 10**9)
        mem, net = fig.axes
        assert [c[0].get_height() for c in mem.containers] == pytest.approx(
            [v / 1e9 for v in layout_memory(chosen, 7_500_000_000).values()])
        names = [row[0] for row in layout_traffic(chosen, 7_500_000_000, gpus, 8, "infiniband")]
        assert [t.get_text() for t in net.get_yticklabels()] == names and len(net.containers) == 1
        assert f"7.5B on {gpus} GPUs" in fig.get_suptitle()
        assert f"estimated step {chosen.layout.step_time_s:.3g} s" in net.get_title()


def test_every_kept_frame_picture_equals_a_full_draw():
    """Blitting draws the data over kept pixels: nothing stale may stay, nothing may be drawn out of order."""
    mem = memory_widget()
    mem.controls["zero"].value = 2
    mem.controls["params"].value = "13B"   # the middle layer: scale and title
    mem.controls["dp"].value = 64          # then the data alone
    full = memory_figure(zero_stage_estimates("13B", dp=64), selected=2, dp=64, title=mem.figure.get_suptitle())
    assert differing(mem.sections[0].png, render_png(full)) < 0.002

    pipe = pipeline_widget()
    pipe.controls["microbatches"].value = 12
    assert differing(pipe.sections[0].png, render_png(pipeline_module._draw(pipe.values())[0])) < 0.002

    traffic = traffic_widget()
    traffic.controls["step"].value = 3
    assert differing(traffic.sections[0].png, render_png(collective_figure("all_reduce", 4, 3, 10**9))) < 0.002
    traffic.controls["dp"].value = 64
    degrees = dict(dp=64, tp=8, pp=4, cp=4, microbatches=1)
    full = strategy_traffic_figure(strategy_traffic("7.5B", **degrees), degrees=degrees,
                                   title=traffic.sections[1].figure.get_suptitle())
    assert differing(traffic.sections[1].png, render_png(full)) < 0.002

    planner = planner_widget()
    planner.controls["gpus"].value = 128
    full = planner_figure(plan(7_500_000_000, 128, 80 * 10**9), 7_500_000_000, 80 * 10**9, 128)
    assert differing(planner.sections[0].png, render_png(full)) < 0.002


def test_a_layer_that_fails_leaves_the_painter_ready_for_the_next_move():
    painter = Layered()
    for step in (1, 2):
        painter.paint(("all_reduce", 4), lambda: collective_frame("all_reduce", 4, 10**9),
                      lambda fig, step=step: collective_data(fig, "all_reduce", 4, step, 10**9))

    def broken(fig):
        collective_data(fig, "all_reduce", 4, 3, 10**9)
        raise ValueError("a layer failed half way")
    with pytest.raises(ValueError, match="half way"):
        painter.paint(("all_reduce", 4), lambda: collective_frame("all_reduce", 4, 10**9), broken)
    fig, png = painter.paint(("all_reduce", 4), lambda: collective_frame("all_reduce", 4, 10**9),
                             lambda fig: collective_data(fig, "all_reduce", 4, 4, 10**9))
    assert differing(png, render_png(collective_figure("all_reduce", 4, 4, 10**9))) < 0.002
