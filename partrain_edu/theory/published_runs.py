"""Published training runs — shape, hardware, layout and what they reported — to hold the models against.

    for run in load(): print(run.run, run.reported, predicted_metric(run))

`published_runs.csv` beside this file has one row per run with its paper, table and page (columns in the CSV's
header; empty where the source does not say). **Splits**: "fit" rows fit `theory.calibration` (and are left out one
source at a time to test it, `calibration_fit.cross_validate`); "held-out" rows were added after the fit was
frozen and only test it (torchtitan's); "excluded" rows are complete but outside what the model prices, each saying
why in its notes (FP8 matmuls, layer-level checkpointing); "reading" rows lack a layout or a result (OPT-175B,
Korthikanti 2022) and are not estimated (`complete` False). **Conventions** (each paper's): Megatron-LM 2021
Table 1, BLOOM, GPT-NeoX and MT-NLG report TFLOP/s per GPU that count the recomputed forward (Narayanan et al.
2021, eq. 3) — held against the model's hardware FLOP/s; Llama 3 and llm-foundry report MFU (model FLOPs only) —
held against the model's MFU; torchtitan reports tokens per second per GPU — held against the model's. A memory
figure is what the run reported, or (`memory_reserved`) the caching allocator's peak reservation, which only bounds
the need from above. Where a layout field was not published and a default is standard (one sequence per
micro-batch, no interleaving), `assumed` names it.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from partrain_edu.theory.calibration import terms
from partrain_edu.theory.estimate import Estimate
from partrain_edu.theory.hardware import canonical
from partrain_edu.theory.layout import Layout
from partrain_edu.theory.model_spec import ModelSpec
from partrain_edu.theory.step_time import step_time

CSV = Path(__file__).with_name("published_runs.csv")
LAYOUT_FIELDS = ("tp", "pp", "dp", "global_batch")
DEFAULTS = {"vpp": 1, "micro_batch": 1, "cp": 1, "ep": 1}   # when not published


@dataclass(frozen=True)
class PublishedRun:
    run: str
    split: str
    device: str
    source: str                  # paper, table, page
    model: ModelSpec | None
    layout: Layout | None
    reported: float              # MFU, or hardware TFLOP/s per GPU (see `convention`); 0 when not published
    convention: str              # "mfu" or "hfu-tflops"
    memory_gb: float | None
    memory_reserved: bool        # memory_gb is the allocator's reservation: an upper bound on the need
    assumed: tuple[str, ...]
    notes: str

    @property
    def complete(self) -> bool:
        return self.model is not None and self.layout is not None and self.reported > 0


def _int(row: dict, key: str) -> int | None:
    return int(row[key]) if row.get(key, "").strip() else None


def _parse(row: dict) -> PublishedRun:
    assumed = []

    def value(key):
        v = _int(row, key)
        if v is None and key in DEFAULTS:
            assumed.append(key)
            return DEFAULTS[key]
        return v

    shape = {k: _int(row, k) for k in ("layers", "hidden", "heads", "vocab", "seq")}
    model = None
    if all(shape.values()):
        gated = bool(_int(row, "gated"))
        model = ModelSpec(row["run"], **shape, kv_heads=_int(row, "kv_heads") or 0, ffn=_int(row, "ffn") or 0,
                          gated=gated, tied_embeddings=bool(_int(row, "tied_embeddings")),
                          learned_positions=bool(_int(row, "learned_positions")),
                          bias=not gated, dropout=bool(_int(row, "dropout")), experts=_int(row, "experts") or 0,
                          top_k=_int(row, "top_k") or 1, moe_ffn=_int(row, "moe_ffn") or 0,
                          moe_layers=_int(row, "moe_layers") or 0)
    layout = None
    if all(_int(row, k) for k in LAYOUT_FIELDS) and row["recompute"].strip():
        vpp = value("vpp")
        layout = Layout(tp=_int(row, "tp"), pp=_int(row, "pp"), dp=_int(row, "dp"), cp=value("cp"), ep=value("ep"),
                        vpp=vpp, zero=_int(row, "zero") or 0, micro_batch=value("micro_batch"),
                        global_batch=_int(row, "global_batch"), recompute=row["recompute"].strip(),
                        attention=("unfused", "flash1", "flash2", "flash3")[_int(row, "flash_attention") or 0],
                        sequence_parallel=bool(_int(row, "sequence_parallel")),
                        gpus_per_node=_int(row, "gpus_per_node") or 8, grad_bytes=_int(row, "grad_bytes") or 4,
                        overlap_dp=bool(_int(row, "overlap_dp")), tp_comm_overlap=bool(_int(row, "tp_comm_overlap")),
                        network_gbps=float(row["network_gbps_per_gpu"] or 0))
    if row["reported_mfu"].strip():
        reported, convention = float(row["reported_mfu"]), "mfu"
    elif row["reported_tflops_per_gpu"].strip() and _int(row, "tflops_counts_recompute"):
        reported, convention = float(row["reported_tflops_per_gpu"]), "hfu-tflops"
    elif row["reported_tokens_per_s_per_gpu"].strip():
        reported, convention = float(row["reported_tokens_per_s_per_gpu"]), "tokens"
    else:
        reported, convention = 0.0, ""
    memory = float(row["reported_memory_gb"]) if row["reported_memory_gb"].strip() else None
    return PublishedRun(row["run"], row["split"], row["device"], f"{row['paper']}, {row['table']}, {row['page']}",
                        model, layout, reported, convention, memory, bool(_int(row, "memory_reserved")),
                        tuple(assumed), row["notes"])


def load(path: Path = CSV) -> list[PublishedRun]:
    with open(path, newline="", encoding="utf-8") as f:
        return [_parse(row) for row in csv.DictReader(f)]


def metric_of(run: PublishedRun, result) -> float:
    """An `Estimate` in the run's own convention: MFU, hardware (recompute-counted) TFLOP/s or tokens/s per GPU."""
    return {"mfu": result.mfu, "tokens": result.tokens_per_s_per_gpu}.get(run.convention, result.hfu_tflops_per_gpu)


def predicted_metric(run: PublishedRun, fitted: dict | None = None) -> float:
    """The model's value for this run in its own convention, with the stored (or `fitted`) efficiency terms: an
    `Estimate` of the step time alone (the fit prices every row hundreds of times and never needs its memory)."""
    timed = step_time(run.model, run.layout, run.device, terms(run.device, fitted))
    return metric_of(run, Estimate(run.model, run.layout, canonical(run.device), None, 0.0, timed.seconds,
                                   timed.breakdown))
