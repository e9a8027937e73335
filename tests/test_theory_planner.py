"""theory.planner: the source notes' decision table as outcomes, and the search's own invariants."""

import pytest

from partrain_edu.theory.memory import estimate_memory
from partrain_edu.theory.planner import USABLE_FRACTION, assumed_shape, candidate_layouts, plan

GB80 = 80_000_000_000


@pytest.mark.parametrize("params, gpus, strategy", [
    (1_300_000_000, 8, "ddp"),
    (1_300_000_000, 64, "ddp"),
    (13_000_000_000, 8, "fsdp"),
    (13_000_000_000, 64, "fsdp"),
    (175_000_000_000, 64, "3d"),
    (175_000_000_000, 1024, "fsdp-tp"),   # ZeRO-3 lets 175B fit without a pipeline (no bubble): 2D is faster
])
def test_must_show_ddp_fsdp_3d_for_1_3b_13b_175b(params, gpus, strategy):
    p = plan(params, gpus, GB80)
    d = p.to_dict()
    assert set(d) == {"strategy", "dp", "tp", "pp", "zero", "bytes_per_device", "reason"}
    assert d["strategy"] == strategy
    assert d["dp"] * d["tp"] * d["pp"] == gpus
    assert 0 < d["bytes_per_device"] <= USABLE_FRACTION * GB80
    assert d["tp"] <= 8                                  # tensor parallel stays inside a node
    assert "\n" not in d["reason"] and ("DDP" in d["reason"] or "FSDP" in d["reason"])
    if strategy == "ddp":
        assert (d["tp"], d["pp"], d["zero"]) == (1, 1, 0)
    if strategy == "fsdp":
        # sharded data parallel in the 3–30B band: ZeRO-3, or ZeRO-2 where enough GPUs share the states
        assert (d["tp"], d["pp"]) == (1, 1) and d["zero"] in (2, 3)
    if strategy == "3d":
        assert d["tp"] > 1 or d["pp"] > 1
    if strategy == "fsdp-tp":
        assert d["tp"] > 1 and (d["pp"], d["zero"]) == (1, 3)


def test_ddp_plan_memory_is_the_memory_model():
    # A 1.3B DDP replica's states are the ZeRO baseline, 16 B per parameter = 20.8 GB.
    p = plan(1_300_000_000, 8, GB80)
    shape = p.shape
    est = estimate_memory(1_300_000_000, layers=shape.layers, hidden=shape.hidden, heads=shape.heads, seq=2048,
                          micro_batch=p.layout.micro_batch, recompute=p.layout.recompute)
    assert est.params_bytes + est.grads_bytes + est.optimizer_bytes == 20_800_000_000
    assert p.layout.bytes_per_device == est.total_bytes
    assert "20.8 GB" in p.reason


@pytest.mark.parametrize("params, layers, hidden, heads", [
    (1_300_000_000, 24, 2048, 16),       # GPT-3 XL
    (13_000_000_000, 40, 5120, 40),      # GPT-3 13B
    (175_000_000_000, 96, 12288, 96),    # GPT-3 175B (Brown et al. 2020, Table 2.1)
])
def test_assumed_shape_matches_gpt3(params, layers, hidden, heads):
    s = assumed_shape(params)
    assert (s.layers, s.hidden, s.heads) == (layers, hidden, heads)


def test_one_gbe_pushes_traffic_off_the_slow_link():
    # Source notes, pitfall 1: over 1 GbE plain data parallel "basically cannot run".
    p = plan(1_300_000_000, 64, GB80, interconnect="1gbe")
    assert p.layout.strategy != "ddp"
    assert "slower" in p.reason


def test_every_candidate_fits_and_uses_every_gpu():
    layouts = candidate_layouts(13_000_000_000, 64, GB80)
    assert layouts
    for lay in layouts:
        assert lay.bytes_per_device <= USABLE_FRACTION * GB80
        assert lay.dp * lay.tp * lay.pp == 64
        assert lay.tp <= 8 and lay.step_time_s > 0
        assert lay.zero in {"ddp": (0,), "fsdp": (2, 3), "fsdp-tp": (3,), "3d": (0, 1)}[lay.strategy]
        if lay.strategy == "fsdp-tp":   # FSDP × TP: ZeRO-3 over dp, tp inside, no pipeline
            assert lay.pp == 1 and lay.tp > 1


def test_more_memory_never_hurts():
    small = plan(13_000_000_000, 64, 40_000_000_000).layout.step_time_s
    big = plan(13_000_000_000, 64, GB80).layout.step_time_s
    assert big <= small * 1.5  # the chosen plan may be simpler, within the simplicity margin


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
    # On 64 GPUs the answer walks ddp -> fsdp -> 3d as the model grows, as the source notes' table does.
    order = {"ddp": 0, "fsdp": 1, "3d": 2}
    sizes = [1, 2, 4, 5, 8, 13, 20, 30, 45, 60, 80, 100, 130, 175]
    seen = [order[plan(int(b * 1e9), 64, GB80).layout.strategy] for b in sizes]
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] == 2 and 1 in seen


def test_a_bigger_batch_lets_data_parallel_hide_its_all_reduce():
    # 1024 sequences over 512 GPUs leave 2 per GPU: too little compute to hide DDP's all-reduce; tp 2 doubles
    # each replica's sequences (FSDP × TP ties TP + ZeRO-1 here, and the simpler family takes the tie).
    assert plan(1_300_000_000, 512, GB80).layout.strategy == "fsdp-tp"
    assert plan(1_300_000_000, 512, GB80, global_batch=8192).layout.strategy == "ddp"


def test_a_small_batch_never_gets_more_replicas_than_sequences():
    # 64 sequences cannot feed 1024 replicas: the rest of the GPUs must split the model (theory.batch_limit).
    chosen = plan("7.5B", 1024, GB80, global_batch=64)
    assert all(lay.dp <= 64 for lay in candidate_layouts("7.5B", 1024, GB80, global_batch=64))
    assert chosen.layout.dp <= 64 and chosen.layout.tp * chosen.layout.pp * chosen.layout.cp >= 16
    assert "a global batch of 64 sequences feeds at most 64 data-parallel replicas" in chosen.reason
    assert plan("7.5B", 1024, GB80, global_batch=4096).layout.dp == 1024   # a big batch feeds them all


def test_fsdp_tp_wins_where_zero3_spares_the_pipeline():
    # 175B on 1024 GPUs: tp 8 alone leaves ZeRO-1's states too big, so 3d needs pp 2 and its bubble; ZeRO-3
    # over the 128 replicas fits without a pipeline, and its traffic hides behind 8 sequences per replica.
    layouts = candidate_layouts("175B", 1024, GB80)
    fastest = {f: min(lay.step_time_s for lay in layouts if lay.strategy == f) for f in ("fsdp-tp", "3d")}
    assert not [lay for lay in layouts if lay.strategy == "3d" and lay.pp == 1]
    chosen = plan("175B", 1024, GB80)
    assert chosen.layout.strategy == "fsdp-tp" and chosen.layout.step_time_s == fastest["fsdp-tp"] < fastest["3d"]
    assert chosen.layout.exposed_dp_s == 0 and "FSDP × TP" in chosen.reason


def test_a_long_sequence_makes_the_plan_split_it():
    short, long = plan("13B", 64, GB80), plan("13B", 64, GB80, seq=262_144)
    assert short.layout.cp == 1 and long.layout.strategy == "cp" and long.layout.cp > 1
    assert long.to_dict()["cp"] == long.layout.cp and f"{262_144 // long.layout.cp:,} of the 262,144" in long.reason
    lay = long.layout
    assert lay.dp * lay.tp * lay.pp * lay.cp == 64 and (262_144 // lay.cp) % lay.tp == 0
