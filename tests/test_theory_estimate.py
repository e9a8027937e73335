"""The calibrated model against published runs, and the pieces it is made of (shapes, stages, memory, the fit)."""
import math

import pytest

from partrain_edu.theory.calibration import FITTED, terms
from partrain_edu.theory.calibration_fit import fit
from partrain_edu.theory.estimate import estimate
from partrain_edu.theory.layout import Layout, stage_layers
from partrain_edu.theory.layout_memory import fullest_stage
from partrain_edu.theory.memory import gpt_param_count
from partrain_edu.theory.model_spec import MODELS, ModelSpec
from partrain_edu.theory.published_runs import load, metric_of, predicted_metric

RUNS = [r for r in load() if r.complete]
MFU_TOLERANCE, MEMORY_TOLERANCE = 0.15, 0.20     # issue 26: relative, in each paper's own convention
KNOWN_MISS_LIMIT = 0.35                           # a known miss may not grow past what it is (+31 %)
# Rows the model misses by more than the tolerance, each with what the model lacks (kept in the table, not hidden).
KNOWN_MISSES = {
    "mpt-13b-h100-sxm-8gpu-2048": "2 sequences per GPU under FSDP on H100: llm-foundry measures 40 % MFU at 8, 16, "
                                  "32 and 64 GPUs alike, so it is no network cost; the model has no term for it",
}


def test_the_table_has_the_runs_the_issue_names():
    names = {r.run for r in load()}
    assert sum(n.startswith("megatron-2021-") for n in names) == 10          # Narayanan et al. 2021, Table 1
    assert {"bloom-176B", "llama3-405B-8192", "llama3-405B-16384"} <= names
    assert all(r.source.count(",") >= 2 for r in load())                      # paper, table, page on every row


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r.run)
def test_each_published_run_is_predicted_and_fits(run):
    result = estimate(run.model, run.layout, run.device)
    predicted = metric_of(run, result)
    error = predicted / run.reported - 1
    assert result.fits, f"{run.run}: {result.memory.total / 1e9:.1f} GB does not fit"
    if run.memory_gb:
        assert abs(result.memory.total / 1e9 / run.memory_gb - 1) <= MEMORY_TOLERANCE
    if run.run in KNOWN_MISSES:
        assert MFU_TOLERANCE < abs(error) <= KNOWN_MISS_LIMIT, f"{run.run}: {error:+.1%} ({KNOWN_MISSES[run.run]})"
    else:
        assert abs(error) <= MFU_TOLERANCE, f"{run.run}: predicted {predicted:.3g}, reported {run.reported:.3g}"


def test_the_stored_fit_is_the_fit_of_the_training_rows():
    assert fit() == FITTED          # nothing tuned by hand: FITTED is what calibration_fit.fit() returns
    for name, residual in FITTED["residuals"].items():
        run = next(r for r in RUNS if r.run == name)
        assert math.log(predicted_metric(run) / run.reported) == pytest.approx(residual, abs=1e-4)


def test_every_device_has_terms_and_none_share_one_constant():
    assert {terms(d).matmul_max for d in ("v100-32gb", "a100-80gb", "h100-sxm")}.__len__() == 3
    assert terms("h800") == terms("h100-sxm") and terms("a100-40gb") == terms("a100-80gb")   # same chip


def test_shapes_count_what_their_papers_say():
    assert MODELS["gpt-1.3b"].params() == gpt_param_count(24, 2048, 50257, 2048)
    assert MODELS["llama3-405b"].params() == pytest.approx(405.9e9, rel=1e-3)    # Dubey et al. 2024: 405B
    assert MODELS["llama3-70b"].params() == pytest.approx(70.55e9, rel=1e-3)
    mixtral = MODELS["mixtral-8x7b"]                                            # Jiang et al. 2024: 46.7B, 12.9B
    assert (mixtral.params(), mixtral.active_params()) == (pytest.approx(46.7e9, rel=1e-3),
                                                           pytest.approx(12.9e9, rel=1e-2))


def test_flops_per_token_follow_the_active_weights():
    gpt = MODELS["gpt3-175b"]
    l, h, s, v = gpt.layers, gpt.hidden, gpt.seq, gpt.vocab
    assert gpt.flops_per_token() == 72 * l * h * h + 12 * l * s * h + 6 * h * v          # Narayanan eq. 3 / 4·3
    assert gpt.flops_per_token("full") - gpt.flops_per_token() == 24 * l * h * h + 4 * l * s * h
    assert gpt.flops_per_token("selective") - gpt.flops_per_token() == 12 * l * s * h    # Korthikanti App. A
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
