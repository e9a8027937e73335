"""theory.traffic: the ring cost model and per-strategy volumes (ZeRO §7, Megatron), by hand."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partrain_edu.theory.traffic import LINKS, link_time, ring_bytes_sent, step_traffic


@pytest.mark.parametrize("op, S, n, sent", [
    ("all_reduce", 1200, 4, 1800),       # 2(n−1)/n · S
    ("all_gather", 1200, 4, 900),        # (n−1)/n · S
    ("reduce_scatter", 1200, 4, 900),
    ("broadcast", 1200, 4, 1200),
    ("send", 1200, 2, 1200),
    ("all_reduce", 1200, 1, 0),          # nobody to talk to
    ("all_gather", 10, 3, 7),            # ⌈20/3⌉
    ("all_reduce", 10, 3, 14),           # ⌈40/3⌉
])
def test_ring_bytes(op, S, n, sent):
    assert ring_bytes_sent(op, S, n) == sent


def test_ddp_is_one_gradient_all_reduce():
    t = step_traffic("ddp", 7_500_000_000, dp=64)
    S = 15_000_000_000  # Ψ · 2 bytes
    assert t.to_dict() == {"per_rank_bytes_sent": 2 * 63 * S // 64,
                           "collectives": [{"op": "all_reduce", "count": 1, "bytes_per_call": S}]}
    assert t.per_rank_bytes_sent == 29_531_250_000


def test_zero1_and_zero2_move_what_ddp_moves_zero3_half_again():
    ddp = step_traffic("ddp", 7_500_000_000, dp=64).per_rank_bytes_sent
    assert step_traffic("zero1", 7_500_000_000, dp=64).per_rank_bytes_sent == ddp   # ZeRO §7.2.1
    assert step_traffic("zero2", 7_500_000_000, dp=64).per_rank_bytes_sent == ddp
    assert step_traffic("zero3", 7_500_000_000, dp=64).per_rank_bytes_sent * 2 == ddp * 3  # §7.2.2: 1.5x
    z3 = step_traffic("zero3", 7_500_000_000, dp=64).to_dict()["collectives"]
    assert z3 == [{"op": "all_gather", "count": 2, "bytes_per_call": 15 * 10**9},
                  {"op": "reduce_scatter", "count": 1, "bytes_per_call": 15 * 10**9}]


def test_sharded_gradients_are_reduced_every_microbatch():
    z2 = step_traffic("zero2", 8000, dp=8, microbatches=4).to_dict()["collectives"]
    assert z2 == [{"op": "reduce_scatter", "count": 4, "bytes_per_call": 16000},
                  {"op": "all_gather", "count": 1, "bytes_per_call": 16000}]
    assert step_traffic("zero3", 8000, dp=8, microbatches=4).per_rank_bytes_sent == 12 * 7 * 16000 // 8
    assert step_traffic("ddp", 8000, dp=8, microbatches=4).per_rank_bytes_sent == 2 * 7 * 16000 // 8


def test_tensor_parallel_four_all_reduces_per_layer_per_microbatch():
    t = step_traffic("tp", tp=8, layers=24, hidden=2048, seq=2048, micro_batch=1, microbatches=2)
    payload = 1 * 2048 * 2048 * 2
    assert t.to_dict()["collectives"] == [{"op": "all_reduce", "count": 4 * 24 * 2, "bytes_per_call": payload}]
    assert t.per_rank_bytes_sent == 4 * 24 * 2 * 2 * 7 * payload // 8
    # with pp = 4 a rank holds 6 of the 24 layers
    assert step_traffic("tp", tp=8, pp=4, layers=24, hidden=2048, seq=2048,
                        micro_batch=1).to_dict()["collectives"][0]["count"] == 4 * 6


def test_pipeline_sends_boundary_activations_and_their_gradients():
    payload = 4 * 1024 * 4096 * 2
    middle = step_traffic("pp", pp=4, hidden=4096, seq=1024, micro_batch=4, microbatches=8)
    assert middle.to_dict() == {"per_rank_bytes_sent": 16 * payload,
                                "collectives": [{"op": "send", "count": 16, "bytes_per_call": payload}]}
    assert step_traffic("pp", pp=2, hidden=4096, seq=1024, micro_batch=4, microbatches=8
                        ).per_rank_bytes_sent == 8 * payload


def test_one_rank_sends_nothing():
    assert step_traffic("ddp", 10**9).to_dict() == {"per_rank_bytes_sent": 0, "collectives": []}


def test_one_gbe_makes_data_parallel_crawl():
    # The source notes' pitfall 1: DDP of a 1.3B model over 1 GbE vs NVLink.
    sent = step_traffic("ddp", 1_300_000_000, dp=8).per_rank_bytes_sent
    assert link_time(sent, "1gbe") > 36          # ≈ 4.55e9 B / 0.125e9 B/s = 36.4 s per step, at least
    assert link_time(sent, "nvlink") < 0.011
    assert LINKS["infiniband"] == 50e9 and LINKS["nvlink"] == 450e9


@pytest.mark.parametrize("call, words", [
    (lambda: step_traffic("allreduce", 10), "--strategy must be one of"),
    (lambda: step_traffic("ddp"), "needs --params"),
    (lambda: step_traffic("ddp", -5, dp=2), "--params must be a positive"),
    (lambda: step_traffic("ddp", 10, dp=0), "--dp must be a positive"),
    (lambda: step_traffic("tp", tp=2, hidden=8, seq=8, micro_batch=1), "missing --layers"),
    (lambda: step_traffic("tp", tp=2, pp=4, layers=30, hidden=8, seq=8, micro_batch=1),
     "--layers 30 is not divisible by --pp 4"),
    (lambda: link_time(10, "carrier-pigeon"), "link must be one of"),
    (lambda: ring_bytes_sent("gather", 10, 2), "op must be one of"),
])
def test_bad_input_raises_one_line(call, words):
    with pytest.raises(ValueError) as err:
        call()
    assert words in str(err.value) and "\n" not in str(err.value)


@given(dp=st.integers(2, 512), k=st.integers(1, 10**8), m=st.integers(1, 8))
def test_zero3_is_one_and_a_half_ddp_per_microbatch(dp, k, m):
    params = dp * k  # divisible, so no rounding
    ddp = step_traffic("ddp", params, dp=dp).per_rank_bytes_sent
    assert step_traffic("zero1", params, dp=dp).per_rank_bytes_sent == ddp
    assert 2 * step_traffic("zero3", params, dp=dp, microbatches=m).per_rank_bytes_sent == 3 * m * ddp
