"""The calibrated model against published runs, and the pieces it is made of (shapes, stages, memory, the fit)."""
import pytest

from partrain_edu.theory.calibration import FITTED, MAMF, terms
from partrain_edu.theory.calibration_fit import (
    cross_validate,
    fit,
    fitting_rows,
    in_sample,
    mean_abs,
    on_bound,
    source_of,
)
from partrain_edu.theory.estimate import estimate
from partrain_edu.theory.layout import Layout, stage_layers
from partrain_edu.theory.layout_memory import TIGHT, fullest_stage
from partrain_edu.theory.memory import gpt_param_count
from partrain_edu.theory.model_spec import MODELS, ModelSpec
from partrain_edu.theory.published_runs import load, predicted_metric

RUNS = [r for r in load() if r.complete and r.split == "fit"]
MFU_TOLERANCE, MEMORY_TOLERANCE = 0.15, 0.20     # issue 26: relative, in each paper's own convention
LOSO_LIMIT = 0.15                                 # issue 37: leave-one-source-out mean |error|, over sources
# Rows the model misses by more than the tolerance stay in the table and the fit (notebook 16 names their causes);
# at most MISS_SHARE of the rows (40 of 229 when this was written, most of them llm-foundry's A100 rows, which one
# stack factor for 2023's A100 and H100 software cannot both meet), none past KNOWN_MISS_LIMIT (25 % then).
MISS_SHARE, KNOWN_MISS_LIMIT = 0.2, 0.3
MPT_13B = {f"mpt-13b-h100-sxm-{n}gpu-2048" for n in (8, 16, 32, 64)}


def _error(run, fitted=None) -> float:
    return predicted_metric(run, fitted) / run.reported - 1


def test_the_table_has_the_runs_the_issue_names():
    names = {r.run for r in load()}
    assert sum(n.startswith("megatron-2021-") for n in names) == 10          # Narayanan et al. 2021, Table 1
    assert {"bloom-176B", "llama3-405B-8192", "llama3-405B-16384", "gpt-neox-20B", "mtnlg-530B-2240"} <= names
    assert sum(n.startswith("mpt-") for n in names) >= 200                     # llm-foundry's tables, every row
    assert all(r.source.count(",") >= 2 for r in load())                      # paper, table, page on every row
    left_out = [r for r in load() if r.split not in ("fit", "held-out")]
    assert all(r.split in ("reading", "excluded") for r in left_out)
    assert all("left out" in r.notes or not r.complete for r in left_out)     # a complete row left out says why


@pytest.mark.parametrize("run", [r for r in load() if r.complete], ids=lambda r: r.run)
def test_every_published_layout_fits_its_gpu(run):
    result = estimate(run.model, run.layout, run.device)
    assert result.fits, f"{run.run}: {result.memory.total / 1e9:.1f} GB does not fit"
    if run.memory_gb and run.memory_reserved:     # the allocator's reservation bounds the need from above
        assert result.memory.total / 1e9 <= run.memory_gb
    elif run.memory_gb:
        assert abs(result.memory.total / 1e9 / run.memory_gb - 1) <= MEMORY_TOLERANCE


def test_a_source_the_fit_never_saw_is_priced_within_the_issues_bounds():
    # torchtitan's bf16 rows were added after the fit was frozen (split "held-out"): 15 runs, FSDP, FSDP × TP
    # (async or not), on the 500 W H100s and on A100s; issue 37 asks mean |error| ≤ 12 %, none over 35 %
    held = [r for r in load() if r.split == "held-out"]
    assert len(held) >= 15 and {source_of(r) for r in held}.isdisjoint({source_of(r) for r in RUNS})
    errors = {r.run: _error(r) for r in held}
    assert sum(map(abs, errors.values())) / len(errors) <= 0.12, errors
    assert max(map(abs, errors.values())) <= 0.35, errors


def test_most_rows_are_within_tolerance_and_the_misses_are_bounded():
    errors = {r.run: _error(r) for r in RUNS}
    misses = {name: e for name, e in errors.items() if abs(e) > MFU_TOLERANCE}
    assert len(misses) <= MISS_SHARE * len(errors), sorted(misses.items(), key=lambda kv: -abs(kv[1]))[:10]
    assert max(map(abs, errors.values())) <= KNOWN_MISS_LIMIT, max(errors.items(), key=lambda kv: abs(kv[1]))


def test_mpt_13b_fsdp_on_8_to_64_h100s_is_within_15_percent_and_flat():
    rows = [r for r in RUNS if r.run in MPT_13B]
    assert len(rows) == 4
    errors = {r.run: round(_error(r), 3) for r in rows}
    assert all(abs(e) <= MFU_TOLERANCE for e in errors.values()), errors
    flat = [predicted_metric(r) for r in rows]         # FSDP across whole nodes costs what it does on one node,
    assert max(flat) / min(flat) < 1.05                # as llm-foundry measured (40 % at 8, 16, 32 and 64)


def test_the_stored_fit_is_the_fit_of_the_rows_and_names_its_bounds():
    assert fit() == FITTED          # nothing tuned by hand: FITTED is what calibration_fit.fit() returns
    assert on_bound(FITTED) == ["overlap_cost"]   # on NCCL's SM share: chosen, not fitted (notebook 16 says so)
    assert {r.run for r in fitting_rows()} == {r.run for r in RUNS}


def test_leave_one_source_out_error_is_printed_and_held():
    held_out = cross_validate()
    per_source = {source: mean_abs(pairs) for source, pairs in held_out.items()}
    assert len(per_source) == len({source_of(r) for r in RUNS}) >= 7
    assert sum(per_source.values()) / len(per_source) <= LOSO_LIMIT, per_source
    in_sample_mean = sum(in_sample().values()) / len(per_source)
    assert in_sample_mean < sum(per_source.values()) / len(per_source)     # unseen sources cost more


def test_every_device_has_terms_from_its_measured_ceiling():
    stack = FITTED["shared"]["stack"]
    assert terms("a100-80gb").matmul_max == pytest.approx(271.2 / 312 * stack)
    assert terms("h100-sxm").matmul_max == pytest.approx(794.5 / 989 * stack)
    assert terms("h800") == terms("h100-sxm") == terms("h200") and terms("a100-40gb") == terms("a100-80gb")
    assert set(MAMF) >= {"a100-80gb", "h100-sxm", "v100-32gb"}


def test_estimate_names_its_caveats():
    tight = estimate(MODELS["llama3-405b"], Layout(tp=8, pp=16, vpp=8, dp=64, zero=2, global_batch=2048), "h100-sxm")
    assert tight.memory_fraction > TIGHT and any(c.startswith("memory:") for c in tight.caveats)
    thirteen = next(r for r in RUNS if r.run == "mpt-13b-h100-sxm-64gpu-2048")
    assert any("FSDP traffic" in c for c in estimate(thirteen.model, thirteen.layout, "h100-sxm").caveats)
    loose = estimate(MODELS["gpt-1.3b"], Layout(dp=8, micro_batch=4), "a100-80gb")
    assert loose.caveats == [] and loose.to_dict()["caveats"] == []


def test_shapes_count_what_their_papers_say():
    assert MODELS["gpt-1.3b"].params() == gpt_param_count(24, 2048, 50257, 2048)
    assert MODELS["llama3-405b"].params() == pytest.approx(405.9e9, rel=1e-3)    # Dubey et al. 2024: 405B
    assert MODELS["llama3-70b"].params() == pytest.approx(70.55e9, rel=1e-3)
    mixtral = MODELS["mixtral-8x7b"]                                            # Jiang et al. 2024: 46.7B, 12.9B
    assert (mixtral.params(), mixtral.active_params()) == (pytest.approx(46.7e9, rel=1e-3),
                                                           pytest.approx(12.9e9, rel=1e-2))


def test_flops_per_token_follow_the_active_weights():
    gpt = MODELS["gpt3-175b"]
    L, h, s, v = gpt.layers, gpt.hidden, gpt.seq, gpt.vocab
    assert gpt.flops_per_token() == 72 * L * h * h + 12 * L * s * h + 6 * h * v          # Narayanan eq. 3 / 4·3
    assert gpt.flops_per_token("full") - gpt.flops_per_token() == 24 * L * h * h + 4 * L * s * h
    assert gpt.flops_per_token("selective") - gpt.flops_per_token() == 12 * L * s * h    # Korthikanti App. A
    mixtral = MODELS["mixtral-8x7b"]
    dense_twin = ModelSpec("", 32, 4096, 32, 32000, 4096, kv_heads=8, ffn=2 * 14336, gated=True,
                           tied_embeddings=False, learned_positions=False, bias=False)
    router = 2 * 3 * 32 * 4096 * 8                                   # h×E per layer, 6 FLOPs per weight
    assert mixtral.flops_per_token() == dense_twin.flops_per_token() + router     # top-2 of 14336 = one 28672


def test_uneven_stages_take_the_shortfall_from_the_ends():
    assert stage_layers(126, 16) == [7] + [8] * 14 + [7]           # Llama 3, §3.3.2
    assert stage_layers(70, 12) == [5] + [6] * 10 + [5]            # BLOOM's partition (its README)
    assert sum(stage_layers(61, 16)) == 61


def test_memory_counts_what_published_runs_name():
    bloom = next(r for r in RUNS if r.run == "bloom-176B")
    states = fullest_stage(bloom.model, bloom.layout)
    # DeepSpeed's BF16 optimizer: bf16 weights 2 B + bf16 and fp32 gradients 6 B per parameter, Adam over dp 8
    assert states.grads == pytest.approx(3 * states.weights) and states.optimizer == pytest.approx(
        12 / 8 * states.params)


@pytest.mark.parametrize("layout, words", [
    (Layout(tp=3), "--tp 3 does not divide"),
    (Layout(pp=200), "--pp 200"),
    (Layout(dp=3, global_batch=8), "not a multiple of dp"),
    (Layout(ep=2), "has none"),
    (Layout(zero=4), "--zero must be"),
    (Layout(pp=2, vpp=2, schedule="zb-h1"), "interleaved"),
    (Layout(vpp=2), "--vpp 2 interleaves"),
])
def test_bad_layouts_are_refused_in_one_line(layout, words):
    with pytest.raises(ValueError, match=words) as err:
        layout.check(MODELS["gpt-1.3b"])
    assert "\n" not in str(err.value)
