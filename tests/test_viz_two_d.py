"""viz.two_d.intensity_figure: the bars are `fsdp_intensity`'s FLOPs per byte, each tp's ticks the F/β of its own
dp group (β from `network.group_link`, k = 8/tp members per node) at peak and, when given, at a sustained rate, and
a bar's colour is its verdict against the realistic tick: the same for every tp."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.colors import to_rgb  # noqa: E402

from partrain_edu.theory.batch_limit import fsdp_intensity, hardware_intensity  # noqa: E402
from partrain_edu.theory.calibration import terms  # noqa: E402
from partrain_edu.theory.hardware import DEVICES  # noqa: E402
from partrain_edu.theory.network import group_link  # noqa: E402
from partrain_edu.viz.palette import FITS, OVER  # noqa: E402
from partrain_edu.viz.two_d import dp_thresholds, intensity_figure  # noqa: E402

H100 = DEVICES["h100"]
SUSTAINED = terms("h100-sxm").matmul(4096) * H100.peak_flops
SETUP = dict(params=7_500_000_000, gpus=512, global_batch=1024, seq=2048, device=H100)
TPS = (1, 2, 4, 8)


def bars_and_ticks(fig):
    ax = fig.axes[0]
    bars = [c[0] for c in ax.containers]
    ticks = [(line.get_xdata().mean(), line.get_ydata()[0], line.get_linestyle()) for line in ax.get_lines()]
    return bars, ticks


def test_bars_are_fsdp_intensity_and_each_tick_is_its_dp_groups_f_over_beta():
    bars, ticks = bars_and_ticks(intensity_figure(**SETUP))
    expected = [fsdp_intensity(SETUP["params"], 1024 * 2048 * tp / 512, 512 // tp, tp) for tp in TPS]
    assert [b.get_height() for b in bars] == pytest.approx(expected, rel=1e-12)
    need = [hardware_intensity(H100.peak_flops, group_link(H100, 512 // tp, 8 // tp).beta) for tp in TPS]
    assert [y for _, y, _ in ticks] == pytest.approx(need) and [x for x, _, _ in ticks] == pytest.approx([0, 1, 2, 3])
    assert need[0] == pytest.approx(dp_thresholds(H100, 512, 1)) and need[-1] == pytest.approx(8 * need[1] / 2)
    assert [to_rgb(b.get_facecolor()[:3]) for b in bars] == [to_rgb(FITS if h >= n else OVER)
                                                             for h, n in zip(expected, need, strict=True)]


def test_tp_lifts_a_bar_and_its_tick_alike_so_the_verdict_does_not_change():
    """512 H100s, 2 sequences per GPU: ≈ 4,100 FLOPs per byte against ≈ 2,700 at tp = 1: compute-bound for
    bandwidth at every tp, the same margin within 7 % (NVLink caps tp = 1's group; (n−1)/n)."""
    bars, ticks = bars_and_ticks(intensity_figure(**SETUP, sustained=SUSTAINED))
    peak = [y for _, y, style in ticks if style == "--"]
    sustained = [y for _, y, style in ticks if style == ":"]
    assert sustained == pytest.approx([dp_thresholds(H100, 512, tp, flops=SUSTAINED) for tp in TPS])
    assert all(s < p for s, p in zip(sustained, peak, strict=True))
    margins = [b.get_height() / p for b, p in zip(bars, peak, strict=True)]
    assert min(margins) > 1 and max(margins) == pytest.approx(min(margins), rel=0.07)   # and (n−1)/n
    assert {to_rgb(b.get_facecolor()[:3]) for b in bars} == {to_rgb(FITS)}


def test_too_few_tokens_per_gpu_is_red_at_every_tp():
    bars, _ = bars_and_ticks(intensity_figure(**{**SETUP, "global_batch": 256}))    # half a sequence per GPU
    assert {to_rgb(b.get_facecolor()[:3]) for b in bars} == {to_rgb(OVER)}
