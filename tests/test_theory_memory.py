"""theory.memory against the papers' published numbers and formulas, written out independently here."""

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory, gpt_param_count, model_state_bytes
from partrain_edu.units import format_bytes

PSI = 7_500_000_000  # the ZeRO paper's running example


def test_zero_figure1_baseline_is_15_15_90():
    est = estimate_memory(PSI)
    assert est.to_dict() == {"params": PSI, "bytes": {
        "params": 15 * 10**9, "grads": 15 * 10**9, "optimizer": 90 * 10**9, "activations": 0,
        "total": 120 * 10**9}}


def test_zero_figure1_stages_at_dp64():
    # Rajbhandari et al. 2020, Figure 1, K = 12, N_d = 64, written from the paper's formulas:
    K, Nd = 12, 64
    expected = [(2 + 2 + K) * PSI,                       # baseline
                2 * PSI + 2 * PSI + K * PSI // Nd,       # P_os
                2 * PSI + (2 + K) * PSI // Nd,           # P_os+g
                (2 + 2 + K) * PSI // Nd]                 # P_os+g+p
    got = [estimate_memory(PSI, dp=Nd, zero=z).total_bytes for z in range(4)]
    assert got == expected == [120_000_000_000, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    # and as the figure prints them
    assert [format_bytes(b) for b in got] == ["120.0 GB", "31.4 GB", "16.6 GB", "1.9 GB"]


@pytest.mark.parametrize("precision, optimizer, per_param", [
    ("mixed", "adam", (2, 2, 12)), ("mixed", "sgd", (2, 2, 8)),
    ("fp32", "adam", (4, 4, 8)), ("fp32", "sgd", (4, 4, 4)),
])
def test_bytes_per_parameter(precision, optimizer, per_param):
    est = estimate_memory(1000, precision=precision, optimizer=optimizer)
    assert (est.params_bytes, est.grads_bytes, est.optimizer_bytes) == tuple(1000 * b for b in per_param)


# Narayanan et al. 2021, Table 1: (billions as printed, heads, hidden, layers); V = 51200, s = 2048.
MEGATRON_TABLE1 = [(1.7, 24, 2304, 24), (3.6, 32, 3072, 30), (7.5, 32, 4096, 36), (18.4, 48, 6144, 40),
                   (39.1, 64, 8192, 48), (76.1, 80, 10240, 60), (145.6, 96, 12288, 80),
                   (310.1, 128, 16384, 96), (529.6, 128, 20480, 105), (1008.0, 160, 25600, 128)]


@pytest.mark.parametrize("billions, heads, h, L", MEGATRON_TABLE1)
def test_megatron_table1_parameter_counts(billions, heads, h, L):
    V, s = 51200, 2048
    # The paper's formula P = 12lh²(1 + 13/(12h) + (V+s)/(12lh)), in exact fractions ...
    paper = 12 * L * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * L * h))
    ours = gpt_param_count(L, h, V, s)
    assert ours - 2 * h == paper  # ... is ours without the final layernorm (2h)
    # Every row we checked (all ten) rounds to the printed count, e.g. 1.65B -> 1.7, 1008.04B -> 1008.0.
    assert round(ours / 1e9, 1) == billions


def test_gpt2_parameter_counts():
    # GPT-2 small and medium as released (tied embedding, learned positions): 124,439,808 and 354,823,168.
    assert gpt_param_count(12, 768, 50257, 1024) == 124_439_808
    assert gpt_param_count(24, 1024, 50257, 1024) == 354_823_168


def test_architecture_counts_params_when_params_missing():
    est = estimate_memory(layers=24, hidden=2304, vocab=51200, seq=2048)
    assert est.params == gpt_param_count(24, 2304, 51200, 2048)
    assert est.total_bytes == 16 * est.params
    assert est.activations_bytes == 0  # no micro-batch given


# Korthikanti et al. 2022, Table 2, written out per row (bytes per layer, 16-bit activations).
S, B, H, A = 2048, 1, 12288, 96  # GPT-3 175B, sequence 2048, micro-batch 1


@pytest.mark.parametrize("t, sp, recompute, formula", [
    (1, False, "none", lambda t: S * B * H * (34 + Fraction(5 * A * S, H))),
    (8, False, "none", lambda t: S * B * H * (10 + Fraction(24, t) + Fraction(5 * A * S, H * t))),
    (8, True, "none", lambda t: S * B * H * (Fraction(34, t) + Fraction(5 * A * S, H * t))),
    (8, False, "selective", lambda t: S * B * H * (10 + Fraction(24, t))),
    (8, True, "selective", lambda t: S * B * H * Fraction(34, t)),
    (1, False, "full", lambda t: 2 * S * B * H),
    (4, False, "full", lambda t: 2 * S * B * H),
    (4, True, "full", lambda t: Fraction(2 * S * B * H, t)),
])
def test_korthikanti_table2(t, sp, recompute, formula):
    got = activation_bytes_per_layer(seq=S, micro_batch=B, hidden=H, heads=A, tp=t, sequence_parallel=sp,
                                     recompute=recompute)
    assert got == formula(t)


def test_korthikanti_fp32_doubles_values_not_masks():
    # 16-bit: 32sbh + 4as²b of values and 2sbh + as²b of 1-byte dropout masks = sbh(34 + 5as/h).
    got = activation_bytes_per_layer(seq=S, micro_batch=2, hidden=H, heads=A, element_bytes=4)
    assert got == 66 * S * 2 * H + 9 * A * S * S * 2


def test_pipeline_first_stage_holds_in_flight_microbatches():
    arch = dict(layers=48, hidden=4096, heads=32, seq=2048, micro_batch=1)
    per_layer = activation_bytes_per_layer(seq=2048, micro_batch=1, hidden=4096, heads=32)
    assert estimate_memory(10**9, **arch).activations_bytes == 48 * per_layer
    # 1F1B: p micro-batches of l/p layers = l layers' worth; fewer when m < p
    assert estimate_memory(10**9, pp=4, **arch).activations_bytes == 4 * 12 * per_layer
    assert estimate_memory(10**9, pp=4, microbatches=2, **arch).activations_bytes == 2 * 12 * per_layer
    # GPipe: all m micro-batches
    gpipe = estimate_memory(10**9, pp=4, schedule="gpipe", microbatches=16, **arch)
    assert gpipe.activations_bytes == 16 * 12 * per_layer


def test_tp_and_pp_divide_model_states_then_zero_shards_over_dp():
    est = estimate_memory(64_000, tp=2, pp=4, dp=8, zero=3)
    assert est.total_bytes == 16 * 64_000 // (2 * 4 * 8)
    est = estimate_memory(64_000, tp=2, pp=4)
    assert est.total_bytes == 16 * 8_000


@pytest.mark.parametrize("kwargs, words", [
    (dict(params=PSI, zero=4), "--zero must be 0, 1, 2 or 3"),
    (dict(params=-1), "--params must be a positive"),
    (dict(params=0), "--params must be a positive"),
    (dict(params=PSI, dp=0), "--dp must be a positive"),
    (dict(), "give --params, or --layers"),
    (dict(layers=24, hidden=1024), "missing --vocab --seq"),
    (dict(params=PSI, layers=30, pp=4), "--layers 30 is not divisible by --pp 4"),
    (dict(params=PSI, layers=24, hidden=1536, heads=12, seq=512, micro_batch=1, tp=8),
     "--heads 12 is not divisible by --tp 8"),
    (dict(params=PSI, layers=24, hidden=1000, heads=16, seq=512, micro_batch=1),
     "--hidden 1000 is not divisible by --heads 16"),
    (dict(params=PSI, layers=24, hidden=1024, heads=16, seq=500, micro_batch=1, tp=8, sequence_parallel=True),
     "--seq 500 is not divisible by --tp 8"),
    (dict(params=PSI, layers=24, hidden=1024, seq=512, micro_batch=1), "missing --heads"),
    (dict(params=PSI, precision="bf16"), "--precision must be one of"),
    (dict(params=PSI, layers=24, hidden=1024, heads=16, seq=512, micro_batch=1, recompute="some"),
     "--recompute must be one of"),
])
def test_bad_input_raises_one_line(kwargs, words):
    with pytest.raises(ValueError) as err:
        estimate_memory(**kwargs)
    assert words in str(err.value)
    assert "\n" not in str(err.value)


@given(dp=st.integers(1, 1024), shard=st.integers(1, 10**9), precision=st.sampled_from(["mixed", "fp32"]),
       optimizer=st.sampled_from(["adam", "sgd"]))
def test_zero3_times_dp_equals_stage0(dp, shard, precision, optimizer):
    psi = dp * shard
    stage0 = sum(model_state_bytes(psi, precision=precision, optimizer=optimizer))
    stage3 = sum(model_state_bytes(psi, dp=dp, zero=3, precision=precision, optimizer=optimizer))
    assert stage3 * dp == stage0


@given(dp=st.integers(1, 1024), psi=st.integers(1, 10**12))
def test_zero_stages_only_shrink_and_padding_is_under_one_element(dp, psi):
    totals = [sum(model_state_bytes(psi, dp=dp, zero=z)) for z in range(4)]
    assert totals == sorted(totals, reverse=True)
    assert 0 <= totals[3] * dp - totals[0] < 16 * dp


def test_python_api_takes_sizes_as_notebooks_write_them():
    assert estimate_memory(7.5e9).total_bytes == estimate_memory("7.5B").total_bytes == 120 * 10**9
    with pytest.raises(ValueError, match="size must be positive"):
        estimate_memory("-7.5B")
