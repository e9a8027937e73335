"""viz.efficiency: the roofline puts each matmul on its device's roof, and the comm/compute widget draws
`theory.efficiency.axis_cost` and redraws when a control moves."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from partrain_edu.theory.efficiency import AXES, arithmetic_intensity, attainable_flops, axis_cost, ridge_point  # noqa: E402
from partrain_edu.theory.hardware import DEVICES  # noqa: E402
from partrain_edu.viz.efficiency import GROUP_SIZES, ratio_widget, roofline_figure  # noqa: E402


def test_roofline_places_each_matmul_on_the_roof_and_marks_the_ridges():
    matmuls = {"1 token": (1, 2048, 2048), "4096 tokens": (4096, 2048, 2048)}
    measured = {"samples": [(1.0, 2e9), (50.0, 4e10)], "peak": 5e10, "bandwidth": 3e9, "label": "this CPU"}
    fig = roofline_figure(matmuls, measured=measured)
    ax, cpu = fig.axes
    dots = [line for line in ax.get_lines() if line.get_marker() == "o"]
    h100 = DEVICES["h100"]
    for dot, (m, k, n) in zip(dots, matmuls.values(), strict=True):
        x = arithmetic_intensity(m, k, n)
        assert dot.get_xdata()[0] == pytest.approx(x)
        assert dot.get_ydata()[0] == pytest.approx(attainable_flops(x, h100) / 1e12)
    ridges = sorted(line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":")
    assert ridges == pytest.approx(sorted(ridge_point(DEVICES[d]) for d in ("a100", "h100")))
    assert [t.get_text().split(":")[0] for t in ax.texts if "FLOPs/B" in t.get_text()] == list(matmuls)
    roof = cpu.get_lines()[0]
    assert np.max(roof.get_ydata()) == pytest.approx(50)          # the measured peak, in GFLOP/s
    assert cpu.get_title() == "this CPU"


def test_ratio_widget_draws_axis_cost_and_redraws_when_sizes_move():
    app = ratio_widget()
    fig = app.figure

    def drawn(figure):
        return {line.get_label().split()[0]: list(line.get_ydata()) for line in figure.axes[0].get_lines()
                if line.get_label().split()[0] in AXES}

    sizes = dict(layers=24, hidden=2048, seq=2048, vocab=50257, micro_batch=4)
    links = {"dp": "infiniband", "fsdp": "infiniband", "pp": "infiniband", "tp": "nvlink", "cp": "nvlink"}
    for axis, values in drawn(fig).items():      # pp stops where its stages would outnumber the 24 layers
        expected = [axis_cost(axis, n, link=links[axis], **sizes).ratio if axis != "pp" or n <= 24 else np.nan
                    for n in GROUP_SIZES]
        np.testing.assert_allclose(values, expected, rtol=1e-12)
    assert np.isnan(drawn(fig)["pp"][GROUP_SIZES.index(32)])
    assert f"tp {axis_cost('tp', 8, **sizes).ratio:.2g}" in app.message
    with app.batch():
        app.controls["hidden"].value = 8192
        app.controls["inside"].value = "infiniband"
    assert app.figure is not fig
    tp = axis_cost("tp", 8, link="infiniband", **{**sizes, "hidden": 8192})
    assert drawn(app.figure)["tp"][GROUP_SIZES.index(8)] == pytest.approx(tp.ratio)
    assert "tp over InfiniBand" in [line.get_label() for line in app.figure.axes[0].get_lines()]
