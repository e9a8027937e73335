"""Tables and the residual figure of notebook 16: the calibrated model held against published training runs.

    from partrain_edu.viz.real_runs import held_against, residual_table, residual_figure, ablation_table
    rows = held_against(load()); residual_table(rows); residual_figure(rows)

Every number comes from `theory.estimate` on the rows of `theory/published_runs.csv`; nothing is decided here.
A row's error is predicted / reported − 1 in the paper's own convention (MFU, or Megatron's recompute-counted
TFLOP/s); `ablation_table` prices the rows again with one efficiency term removed at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from partrain_edu.theory.calibration import Efficiency, terms
from partrain_edu.theory.estimate import Estimate, estimate
from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.published_runs import metric_of
from partrain_edu.viz.palette import FITS, INK, OVER, PARAMS, clean


@dataclass(frozen=True)
class Held:
    run: object               # a published_runs.PublishedRun
    result: Estimate
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.run.reported - 1


def held_against(runs, eff_of=None) -> list[Held]:
    """Each complete run estimated; `eff_of(device) -> Efficiency` replaces the fitted terms (an ablation)."""
    rows = []
    for run in (r for r in runs if r.complete):
        result = estimate(run.model, run.layout, run.device, eff=(eff_of or terms)(run.device))
        rows.append(Held(run, result, metric_of(run, result)))
    return rows


def layout_text(lay) -> str:
    parts = [f"{k} {v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("v", lay.vpp), ("cp", lay.cp),
                                     ("ep", lay.ep), ("dp", lay.dp)) if v > 1 or k in ("tp", "pp", "dp")]
    return " ".join(parts) + f" Z{lay.zero} {lay.recompute[:4]}"


def runs_table(runs) -> None:
    print(f"{'run':<32} {'source':<44} {'GPUs':>6}  {'device':<10} {'reported':>9}")
    for run in runs:
        reported = f"{run.reported:.0%} MFU" if run.convention == "mfu" else (
            f"{run.reported:.0f} TF/s" if run.reported else "—")
        print(f"{run.run:<32} {run.source[:44]:<44} {run.layout.gpus if run.layout else 0:>6}  {run.device:<10} "
              f"{reported:>9}" + ("" if run.complete else "   (layout or result not published)"))


def residual_table(rows: list[Held]) -> None:
    print(f"{'run':<32} {'set':<5} {'layout':<26} {'reported':>8} {'model':>8} {'error':>7}  memory (published)")
    for h in rows:
        fmt = (lambda v: f"{v:.1%}") if h.run.convention == "mfu" else (lambda v: f"{v:.0f} TF")
        mem = f"{h.result.memory.total / 1e9:.0f} GB" + (f" ({h.run.memory_gb:.0f})" if h.run.memory_gb else "")
        print(f"{h.run.run:<32} {h.run.split:<5} {layout_text(h.run.layout):<26} {fmt(h.run.reported):>8} "
              f"{fmt(h.predicted):>8} {h.error:>+7.1%}  {mem}{'' if h.result.fits else ' DOES NOT FIT'}")
    for split in ("train", "test"):
        errors = [abs(h.error) for h in rows if h.run.split == split]
        print(f"{split}: {len(errors)} rows, mean |error| {sum(errors) / len(errors):.1%}, largest {max(errors):.1%}")


def residual_figure(rows: list[Held], tolerance: float = 0.15) -> Figure:
    """One bar per run: the model's error, training rows dark, held-out rows light, the ±tolerance band."""
    fig, ax = plt.subplots(figsize=(11, 3.8))
    ax.axhspan(-tolerance, tolerance, color=FITS, alpha=0.08, lw=0)
    for i, h in enumerate(rows):
        color = OVER if abs(h.error) > tolerance else PARAMS
        ax.bar(i, h.error, color=color, alpha=1.0 if h.run.split == "train" else 0.5)
    ax.axhline(0, color=INK, lw=0.8)
    ax.set_xticks(range(len(rows)), [h.run.run for h in rows], rotation=60, ha="right", fontsize=7.5)
    ax.set_ylabel("predicted / reported − 1")
    ax.set_title(f"The calibrated model against published runs (dark: fitted on, light: held out; band ±{tolerance:.0%})")
    clean(ax)
    fig.tight_layout()
    plt.close(fig)    # shown once, as the cell's value
    return fig


def ablations() -> dict[str, object]:
    """Efficiency terms to price the rows with: the fit, the fit less one term, and the old planner's constant."""
    def minus(**changes):
        return lambda device: replace(terms(device), **changes)
    return {"calibrated": terms,
            "matmuls at peak (η = 1)": minus(matmul_max=1.0, half_width=0.0),
            "no per-layer overhead": minus(layer_overhead_s=0.0),
            "links at datasheet rate": minus(link=1.0),
            "overlap costs nothing": minus(overlap_cost=0.0),
            "400 TFLOP/s on every GPU": lambda device: Efficiency(400e12 / device_named(device).peak_flops, 0.0,
                                                                    0.0, 1.0)}


def ablation_table(runs) -> None:
    print(f"{'efficiency terms':<28} {'mean |error|':>12} {'A100 rows':>10} {'H100 rows':>10} {'V100 rows':>10}")
    for name, eff_of in ablations().items():
        rows = held_against(runs, eff_of)
        by = {chip: [h.error for h in rows if h.run.device.startswith(chip)] for chip in ("a100", "h100", "v100")}
        mean = sum(abs(h.error) for h in rows) / len(rows)
        print(f"{name:<28} {mean:>12.1%} " + " ".join(
            f"{sum(e) / len(e):>+10.0%}" if e else f"{'—':>10}" for e in by.values()))


def geometric_ratio(rows: list[Held]) -> float:
    return math.exp(sum(math.log(1 + h.error) for h in rows) / len(rows))


def planner_beside_published(cases) -> None:
    """For each (title, model, device, gpus, global batch, published layout): the planner's three fastest layouts
    and its answer, searched with the published run's own framework features (flash attention, sequence
    parallelism, gradient bytes, overlap, network), and the published layout costed beside them."""
    from partrain_edu.theory.planner import plan
    for title, model, device, gpus, batch, published in cases:
        p = plan(None, gpus, model=model, device=device, global_batch=batch, given=published, stack=published)
        fastest = p.top[0].step_time_s
        print(f"{title} — {gpus} × {device}, {batch} sequences per step")
        for cand, mark in [(c, "fastest" if i == 0 else "") for i, c in enumerate(p.top)] + [
                (p.layout, "answer"), (p.given, "published")]:
            print(f"   {mark:<10}{cand.text():<44} {cand.step_time_s:7.3g} s  {cand.step_time_s / fastest:5.2f}×"
                  f"  MFU {cand.estimate.mfu:5.1%}  {cand.bytes_per_device / 1e9:4.0f} GB")
