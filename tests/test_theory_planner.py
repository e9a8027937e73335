"""theory.planner: the source notes' decision order as outcomes of the calibrated model, and published layouts."""

import pytest

from partrain_edu.theory.layout import Layout as Spread
from partrain_edu.theory.layout_memory import TIGHT, fullest_stage
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.planner import SIMPLICITY_MARGIN, assumed_model, assumed_shape, candidate_layouts, plan

GB80 = 80_000_000_000


@pytest.mark.parametrize("params, gpus, strategy", [
    (1_300_000_000, 8, "ddp"),
    (1_300_000_000, 64, "ddp"),
    (13_000_000_000, 8, "fsdp"),
    (13_000_000_000, 64, "fsdp"),      # across whole nodes FSDP owns each node's 8 ports (`theory.network`)
    (175_000_000_000, 64, "fsdp"),     # with full recompute; 3D within the margin (notebook 08)
    (175_000_000_000, 1024, "3d"),     # one sequence per GPU: FSDP needs full recompute, 3D none
])
def test_the_notes_order_ddp_fsdp_then_model_parallel(params, gpus, strategy):
    d = plan(params, gpus, GB80).to_dict()
    assert set(d) == {"strategy", "dp", "tp", "pp", "zero", "bytes_per_device", "reason", "best"}
    assert d["strategy"] == strategy and d["dp"] * d["tp"] * d["pp"] == gpus
    assert 0 < d["bytes_per_device"] <= GB80 and d["tp"] <= 8      # fits; tensor parallel stays inside a node
    assert "\n" not in d["reason"] and len(d["best"]) == 3
    assert {"ddp": (1, 1), "fsdp": (1, 1)}.get(strategy, (d["tp"], d["pp"])) == (d["tp"], d["pp"])


def test_the_plan_memory_is_the_layout_memory_model():
    chosen = plan(1_300_000_000, 8, GB80)
    assert chosen.layout.bytes_per_device == round(fullest_stage(assumed_model(1_300_000_000),
                                                                 chosen.layout.estimate.layout).total)
    assert "21.1 GB of mixed-precision Adam states" in chosen.reason      # 16 B per parameter


@pytest.mark.parametrize("params, layers, hidden, heads", [
    (1_300_000_000, 24, 2048, 16),       # GPT-3 XL
    (13_000_000_000, 40, 5120, 40),      # GPT-3 13B
    (175_000_000_000, 96, 12288, 96),    # GPT-3 175B (Brown et al. 2020, Table 2.1)
])
def test_assumed_shape_matches_gpt3(params, layers, hidden, heads):
    s = assumed_shape(params)
    assert (s.layers, s.hidden, s.heads) == (layers, hidden, heads)


def test_one_gbe_leaves_no_layout_that_runs_well():
    # Source notes, pitfall 1: over 1 GbE plain data parallel "basically cannot run". Each node's 8 ports carry
    # any split's traffic (`theory.network`): no layout escapes, every one runs at a tenth of InfiniBand's MFU.
    slow, fast = (plan(1_300_000_000, 64, GB80, interconnect=net).layout for net in ("1gbe", "infiniband"))
    assert slow.estimate.mfu < 0.1 * fast.estimate.mfu


def test_every_candidate_fits_uses_every_gpu_and_is_named_by_its_degrees():
    for lay in candidate_layouts(13_000_000_000, 64, GB80):
        assert lay.bytes_per_device <= GB80 and lay.dp * lay.tp * lay.pp * lay.cp == 64 and lay.step_time_s > 0
        family = ("cp" if lay.cp > 1 else "3d" if lay.pp > 1 or (lay.tp > 1 and lay.zero < 3) else
                  "fsdp-tp" if lay.tp > 1 else "fsdp" if lay.zero >= 2 else "ddp")
        assert lay.strategy == family


def test_the_simplest_family_within_the_margin_wins():
    layouts = candidate_layouts(7_000_000_000, 64, GB80)
    chosen = plan(7_000_000_000, 64, GB80).layout
    fastest = min(lay.step_time_s for lay in layouts)
    # FSDP (ZeRO-2) is the fastest; DDP with ZeRO-1 is within the margin, so the simpler family wins
    assert chosen.strategy == "ddp" and fastest < chosen.step_time_s <= SIMPLICITY_MARGIN * fastest
    assert plan(13_000_000_000, 64, 40_000_000_000).layout.strategy == "fsdp"   # on 40 GB it is the only 1D choice


@pytest.mark.parametrize("kwargs, words", [
    (dict(params=175_000_000_000, gpus=8, gpu_memory=GB80), "use more GPUs"),
    (dict(params=13_000_000_000, gpus=12, gpu_memory=GB80), "--gpus 12 is not a multiple of --gpus-per-node 8"),
    (dict(params=0, gpus=8, gpu_memory=GB80), "--params must be a positive"),
    (dict(params=10**9, gpus=0, gpu_memory=GB80), "--gpus must be a positive"),
    (dict(params=10**9, gpus=8, gpu_memory=GB80, interconnect="wifi"), "--interconnect must be one of"),
])
def test_bad_input_raises_one_line(kwargs, words):
    with pytest.raises(ValueError) as err:
        plan(**kwargs)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_families_grow_with_the_model_and_never_step_back():
    order = {"ddp": 0, "fsdp": 1, "fsdp-tp": 2, "3d": 3}
    seen = [order[plan(int(b * 1e9), 64, GB80).layout.strategy] for b in (1, 2, 4, 8, 13, 30, 60, 100, 175)]
    # DDP while the states fit, then sharding: on 64 GPUs FSDP stays within the margin up to 175B once its
    # traffic crosses the nodes on all their NICs (issue 37; the notes' table says FSDP from 3B to 30B)
    assert seen == sorted(seen) and seen[0] == 0 and 1 in seen


def test_the_batch_caps_data_parallelism():
    assert plan(1_300_000_000, 512, GB80, global_batch=8192).layout.strategy == "ddp"
    chosen = plan("7.5B", 1024, GB80, global_batch=64)
    assert all(lay.dp <= 64 for lay in candidate_layouts("7.5B", 1024, GB80, global_batch=64))
    assert chosen.layout.tp * chosen.layout.pp * chosen.layout.cp >= 16
    assert "a global batch of 64 sequences feeds at most 64 data-parallel replicas" in chosen.reason


def test_a_long_sequence_makes_the_plan_split_it():
    long = plan("8B", 64, GB80, seq=131072)
    d = long.to_dict()
    assert d["strategy"] == "cp" and d["cp"] > 1 and d["dp"] * d["tp"] * d["pp"] * d["cp"] == 64
    assert f"{131072 // d['cp']:,} of the 131,072 positions" in d["reason"]
    assert all(lay.cp == 1 for lay in candidate_layouts("8B", 64, GB80))   # 2048 positions: never split


@pytest.mark.parametrize("gpus, dp", [(8192, 64), (16384, 128)])
def test_llama3_plan_is_the_published_layout(gpus, dp):
    # Dubey et al. 2024, Table 4: TP 8, PP 16, DP 64 / 128, interleaved (V = 8, see published_runs.csv), FSDP
    published = Spread(tp=8, pp=16, vpp=8, dp=dp, zero=2)
    p = plan(None, gpus, model=MODELS["llama3-405b"], device="h100-sxm", global_batch=2048, given=published)
    # the published layout uses 97 % of the HBM by the model: the planner, keeping 10 % free, cannot pick it, and
    # costs it within the model's error of its pick
    assert p.given.estimate.memory_fraction > TIGHT >= p.layout.estimate.memory_fraction
    assert p.given.step_time_s <= 1.10 * p.top[0].step_time_s


def test_gpt3_published_layout_is_costed_beside_the_best():
    # Narayanan et al. 2021 ran the nearest size of Table 1 (145.6B) as t 8, p 8 with 2 chunks per stage. The model
    # prices tp 8's narrow matmuls (h/8 = 1536 wide) about 14 % slower than tp 2's and so prefers tp 2, against the
    # paper's Takeaway #1 (tp up to the node's 8): a disagreement past the model's ~10 % error (review M9).
    p = plan(None, 1024, model=MODELS["gpt3-175b"], device="a100-80gb", global_batch=1536,
             given=Spread(tp=8, pp=8, vpp=2, dp=16))
    assert p.top[0].step_time_s <= p.given.step_time_s <= 1.3 * p.top[0].step_time_s
    assert p.layout.tp < 8 and len({c.text() for c in p.top}) == 3
