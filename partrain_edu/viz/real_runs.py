"""Tables and figures of notebook 16: the calibrated model held against published training runs.

    from partrain_edu.viz.real_runs import held_against, residual_table, residual_figure, ablation_table
    rows = held_against(load()); residual_table(rows); residual_figure(rows)

Every number comes from `theory.estimate` and `theory.calibration_fit` on the rows of `theory/published_runs.csv`;
nothing is decided here. A row's error is predicted / reported − 1 in the paper's own convention (MFU, or
Megatron's recompute-counted TFLOP/s). Means are over sources (each paper weighs one), as in the fit.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from partrain_edu.theory.calibration import FITTED, Efficiency, terms
from partrain_edu.theory.calibration_fit import fitting_rows, mean_abs, source_of
from partrain_edu.theory.estimate import Estimate, estimate
from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.network import DATASHEET
from partrain_edu.theory.published_runs import metric_of
from partrain_edu.viz.palette import FITS, INK, RANKS, clean

LISTED = 12     # a source with more rows than this is summarised per device and model in the tables


@dataclass(frozen=True)
class Held:
    run: object               # a published_runs.PublishedRun
    result: Estimate
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.run.reported - 1

    @property
    def source(self) -> str:
        return source_of(self.run)


def held_against(runs, eff_of=None) -> list[Held]:
    """Each fitting row (split "fit", complete) estimated; `eff_of(device) -> Efficiency` replaces the fitted
    terms (an ablation)."""
    rows = []
    for run in fitting_rows(runs):
        result = estimate(run.model, run.layout, run.device, eff=(eff_of or terms)(run.device))
        rows.append(Held(run, result, metric_of(run, result)))
    return rows


def by_source(rows: list[Held]) -> dict[str, list[Held]]:
    out = {}
    for h in rows:
        out.setdefault(h.source, []).append(h)
    return out


def layout_text(lay) -> str:
    parts = [f"{k} {v}" for k, v in (("tp", lay.tp), ("pp", lay.pp), ("v", lay.vpp), ("cp", lay.cp),
                                     ("ep", lay.ep), ("dp", lay.dp)) if v > 1 or k in ("tp", "pp", "dp")]
    attention = {"unfused": "unf", "flash1": "fa1", "flash2": "fa2", "flash3": "fa3"}[lay.attention]
    return " ".join(parts) + f" Z{lay.zero} {lay.recompute[:4]} {attention}"


def _span(values, fmt="{}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def _reported(run) -> str:
    if not run.reported:
        return "—"
    return {"mfu": f"{run.reported:.1%} MFU", "tokens": f"{run.reported:,.0f} tok/s"}.get(
        run.convention, f"{run.reported:.0f} TF/s")


def _size(run) -> str:
    """A row's model size in billions of parameters: "13B", "0.76B"."""
    return f"{run.model.params() / 1e9:.2g}B"


def runs_table(runs) -> None:
    """Every row of a small source; a large one (llm-foundry) one line per device. "—": not published."""
    groups = {}
    for run in runs:
        groups.setdefault(source_of(run), []).append(run)
    print(f"{'run':<38} {'split':<9} {'GPUs':>6}  {'device':<10} {'reported':>10}")
    for source, members in groups.items():
        print(f"{source} ({len(members)} rows)")
        if len(members) <= LISTED:
            for run in members:
                gpus = f"{run.layout.gpus}" if run.layout else "—"
                print(f"  {run.run:<36} {run.split:<9} {gpus:>6}  {run.device:<10} {_reported(run):>10}")
            continue
        for (device, split, convention), rs in sorted(_group(members, lambda r: (r.device, r.split,
                                                                                   r.convention)).items()):
            sizes = sorted({_size(r) for r in rs}, key=lambda b: float(b[:-1]))
            label = f"{len(rs)} rows: {sizes[0]}–{sizes[-1]}, seq {_span([r.model.seq for r in rs])}"
            unit = {"mfu": ("% MFU", 100, "{:.0f}"), "tokens": (" tok/s", 1, "{:,.0f}")}[convention]
            print(f"  {label:<36} {split:<9} {_span([r.layout.gpus for r in rs]):>6}  {device:<10} "
                  f"{_span([unit[1] * r.reported for r in rs], unit[2]):>6}{unit[0]}")


def _group(items, key) -> dict:
    out = {}
    for item in items:
        out.setdefault(key(item), []).append(item)
    return out


def residual_table(rows: list[Held]) -> None:
    """Per source: each row (a large source: one line per device and model), then the source's mean |error|."""
    print(f"{'run':<34} {'layout':<34} {'reported':>9} {'model':>8} {'error':>7}  memory")
    for source, members in by_source(rows).items():
        print(f"{source}: {len(members)} rows, mean |error| {mean_abs([(0, h.error) for h in members]):.1%}")
        if len(members) <= LISTED:
            for h in members:
                fmt = (lambda v: f"{v:.1%}") if h.run.convention == "mfu" else (lambda v: f"{v:.0f} TF")
                mem = f"{h.result.memory.total / 1e9:.0f} GB" + (
                    f" (paper {h.run.memory_gb:.0f})" if h.run.memory_gb else "")
                print(f"  {h.run.run:<32} {layout_text(h.run.layout):<34} {fmt(h.run.reported):>9} "
                      f"{fmt(h.predicted):>8} {h.error:>+7.1%}  {mem}")
            continue
        for (device, model), hs in _group(members, lambda h: (h.run.device, h.run.run.split("-")[1])).items():
            lays = {"FSDP" if h.run.layout.zero == 3 else f"ZeRO-{h.run.layout.zero}" for h in hs}
            gpus = _span([h.run.layout.gpus for h in hs])
            print(f"  MPT-{model.upper():<5} {device:<10} {len(hs):>3} rows, {gpus:>6}"
                  f" GPUs, {'/'.join(sorted(lays)):<13} error {_span([100 * h.error for h in hs], '{:+.0f}')} %")


def residual_figure(rows: list[Held], tolerance: float = 0.15) -> Figure:
    """Every fitting row's error, one column of points per source, coloured by device; the ±tolerance band."""
    groups = by_source(rows)
    devices = sorted({h.run.device for h in rows})
    fig, ax = plt.subplots(figsize=(11, 4))
    ax.axhspan(-tolerance, tolerance, color=FITS, alpha=0.08, lw=0)
    for i, members in enumerate(groups.values()):
        for j, h in enumerate(members):
            x = i + ((j * 0.618) % 1 - 0.5) * 0.6 if len(members) > 1 else i    # spread, not random
            ax.plot(x, h.error, "o", ms=4, alpha=0.75, color=RANKS[devices.index(h.run.device)])
    for k, device in enumerate(devices):
        ax.plot([], [], "o", color=RANKS[k], label=device)
    ax.axhline(0, color=INK, lw=0.8)
    ax.set_xticks(range(len(groups)), [f"{s}\n({len(m)} rows)" for s, m in groups.items()], fontsize=8)
    ax.set_ylabel("predicted / reported − 1")
    ax.set_title(f"The calibrated model against every fitting row (band ±{tolerance:.0%})")
    ax.legend(fontsize=8, ncol=len(devices), loc="lower right")
    clean(ax)
    fig.tight_layout()
    plt.close(fig)    # shown once, as the cell's value
    return fig


def held_out_table(runs) -> list[Held]:
    """Each "held-out" row (added after the fit was frozen): the layout, the reported and predicted tokens/s per GPU,
    the error, and the memory the model gives it beside the allocator's reservation the run reported."""
    rows = []
    for run in (r for r in runs if r.split == "held-out" and r.complete):
        result = estimate(run.model, run.layout, run.device)
        rows.append(Held(run, result, metric_of(run, result)))
    print(f"{'run':<34} {'layout':<32} {'tok/s':>7} {'model':>7} {'error':>7}  memory (reserved)")
    for h in rows:
        reserved = f" ({h.run.memory_gb:.0f})" if h.run.memory_gb else ""
        print(f"{h.run.run:<34} {layout_text(h.run.layout):<32} {h.run.reported:>7,.0f} {h.predicted:>7,.0f} "
              f"{h.error:>+7.1%}  {h.result.memory.total / 1e9:.0f} GB{reserved}")
    print(f"{len(rows)} rows: mean |error| {mean_abs([(0, h.error) for h in rows]):.1%}, the largest "
          f"{max(abs(h.error) for h in rows):.1%}; every layout fits: {all(h.result.fits for h in rows)}")
    return rows


def fit_table(in_sample: dict[str, float], left_out: dict[str, list]) -> None:
    """Per source: its rows, the stored fit's mean |error| on them, and leave-one-source-out's."""
    print(f"{'source':<34} {'rows':>5} {'in-sample':>10} {'left out':>9}")
    for source in sorted(left_out):
        print(f"{source:<34} {len(left_out[source]):>5} {in_sample[source]:>10.1%} {mean_abs(left_out[source]):>9.1%}")
    loso = [mean_abs(pairs) for pairs in left_out.values()]
    every = [pair for pairs in left_out.values() for pair in pairs]
    print(f"{'mean over sources':<40} {sum(in_sample.values()) / len(in_sample):>10.1%} {sum(loso) / len(loso):>9.1%}")
    print(f"{'mean over rows (left out)':<40} {'':>10} {mean_abs(every):>9.1%}")


def known_misses(rows: list[Held]) -> None:
    """The misses notebook 16 names, each with the model's own caveat for it (`Estimate.caveats`)."""
    picks = [h for h in rows if h.run.run.startswith("mpt-13b-h100-sxm") and h.run.layout.micro_batch == 2
             and h.run.model.seq == 2048]
    picks += [h for h in rows if h.source.startswith("Narayanan")][:1]
    picks += [h for h in rows if h.run.run.startswith("llama3") and h.run.model.seq > 8192]
    for h in picks:
        print(f"{h.run.run:<34} micro-batch {h.run.layout.micro_batch:>2}, {h.run.layout.gpus:>5} GPUs, "
              f"seq {h.run.model.seq:>6}: error {h.error:+.1%}")
        for caveat in h.result.caveats:
            print(f"    caveat: {caveat}")
    narayanan = [h.error for h in rows if h.source.startswith("Narayanan")]
    print(f"Narayanan et al. 2021, all {len(narayanan)} rows: {_span([100 * e for e in narayanan], '{:+.0f}')} %")
    print("the five largest misses:")
    for h in sorted(rows, key=lambda h: -abs(h.error))[:5]:
        print(f"  {h.run.run:<32} micro-batch {h.run.layout.micro_batch:>3}, {h.run.layout.gpus:>5} GPUs: "
              f"error {h.error:+.1%}" + ("" if h.result.caveats else "   (no caveat applies)"))


def ablations() -> dict[str, object]:
    """name: efficiency terms per device: the fit, the fit less one term, and the old planner's constant (400
    TFLOP/s and links at datasheet rate; it keeps the FlashAttention rate, the HBM-bound elementwise work and α)."""
    def minus(**changes):
        return lambda device: replace(terms(device), **changes)
    return {"calibrated": terms,
            "matmuls at peak (η = 1)": minus(matmul_max=1.0, half_width=0.0),
            "stack = 1 (η_max = MAMF)": lambda d: terms(d, {"shared": {**FITTED["shared"], "stack": 1.0}}),
            "no per-layer overhead": minus(layer_overhead_s=0.0),
            "overlap costs nothing": minus(overlap_cost=0.0),
            "links at datasheet rate": minus(links=DATASHEET),
            "400 TFLOP/s, links at datasheet": lambda device: Efficiency(
                400e12 / device_named(device).peak_flops, 0.0, 0.0, 0.0, links=DATASHEET)}


def ablation_table(runs) -> None:
    """Mean |error| over sources, and the mean signed error per chip, with each term removed (no refit)."""
    print(f"{'efficiency terms':<32} {'mean |error|':>12} {'A100 rows':>10} {'H100 rows':>10} {'V100 rows':>10}")
    for name, eff_of in ablations().items():
        rows = held_against(runs, eff_of)
        per_source = [mean_abs([(0, h.error) for h in hs]) for hs in by_source(rows).values()]
        by = {chip: [h.error for h in rows if h.run.device.startswith(chip)] for chip in ("a100", "h100", "v100")}
        print(f"{name:<32} {sum(per_source) / len(per_source):>12.1%} " + " ".join(
            f"{sum(e) / len(e):>+10.0%}" if e else f"{'—':>10}" for e in by.values()))


def planner_beside_published(cases) -> None:
    """For each (title, model, device, gpus, global batch, published layout): the planner's three fastest layouts
    and its answer (the simplest family within `planner.SIMPLICITY_MARGIN` of the fastest), searched with the
    published run's own framework features, and the published layout costed beside them; memory as GB and as the
    share of the GPU's HBM the model gives it."""
    from partrain_edu.theory.planner import plan
    for title, model, device, gpus, batch, published in cases:
        p = plan(None, gpus, model=model, device=device, global_batch=batch, given=published, stack=published)
        fastest = p.top[0].step_time_s
        print(f"{title} — {gpus} × {device}, {batch} sequences per step")
        for cand, mark in [(c, "fastest" if i == 0 else "") for i, c in enumerate(p.top)] + [
                (p.layout, "answer"), (p.given, "published")]:
            print(f"   {mark:<10}{cand.text():<44} {cand.step_time_s:7.3g} s  {cand.step_time_s / fastest:5.2f}×"
                  f"  MFU {cand.estimate.mfu:5.1%}  {cand.bytes_per_device / 1e9:4.0f} GB"
                  f" ({cand.estimate.memory_fraction:.0%})", flush=True)
