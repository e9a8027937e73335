"""viz.two_d.intensity_figure: the bars are `fsdp_intensity`'s FLOPs per byte, the lines the link's F/β at peak and,
when given, at the calibrated rates, and a bar's colour is its verdict against the realistic line."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from partrain_edu.theory.batch_limit import fsdp_intensity, hardware_intensity  # noqa: E402
from partrain_edu.theory.calibration import terms  # noqa: E402
from partrain_edu.theory.hardware import DEVICES  # noqa: E402
from partrain_edu.theory.step_time import link_cost  # noqa: E402
from partrain_edu.viz.palette import FITS, OVER  # noqa: E402
from partrain_edu.viz.two_d import intensity_figure  # noqa: E402

H100 = DEVICES["h100"]
CALIBRATED = (terms("h100-sxm").matmul(4096) * H100.peak_flops, link_cost("h100-sxm", inside_node=False)[1])
SETUP = dict(params=7_500_000_000, gpus=512, global_batch=1024, seq=2048, flops=H100.peak_flops, bandwidth=H100.nic)


def bars_and_lines(fig):
    ax = fig.axes[0]
    bars = list(ax.containers[0])
    lines = sorted(line.get_ydata()[0] for line in ax.get_lines())
    return bars, lines


def test_bars_are_fsdp_intensity_and_the_line_is_peak_f_over_beta():
    bars, lines = bars_and_lines(intensity_figure(**SETUP))
    expected = [fsdp_intensity(SETUP["params"], 1024 * 2048 * tp / 512, 512 // tp, tp) for tp in (1, 2, 4, 8)]
    assert [b.get_height() for b in bars] == pytest.approx(expected, rel=1e-12)
    assert lines == pytest.approx([hardware_intensity(H100.peak_flops, H100.nic)])
    peak = lines[0]
    assert [to_rgb(b.get_facecolor()[:3]) for b in bars] == [to_rgb(FITS if h >= peak else OVER) for h in expected]


def test_a_calibrated_line_is_drawn_below_the_peak_one_and_judges_the_bars():
    bars, lines = bars_and_lines(intensity_figure(**SETUP, calibrated=CALIBRATED))
    calibrated, peak = lines
    assert calibrated == pytest.approx(hardware_intensity(*CALIBRATED)) and calibrated < peak
    heights = [b.get_height() for b in bars]
    between = [h for h in heights if calibrated <= h < peak]
    assert between, "the example should have a tp that only the calibrated rates call compute-bound"
    assert [to_rgb(b.get_facecolor()[:3]) for b in bars] == [to_rgb(FITS if h >= calibrated else OVER)
                                                             for h in heights]
