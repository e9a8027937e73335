"""Context parallelism in theory/ (pure Python): the grid's cp dimension, the ring's K/V bytes, the activations'
sequence shard (the planner's cp search: tests/test_theory_planner.py)."""
import pytest

from partrain_edu.theory import grid
from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory
from partrain_edu.theory.traffic import cp_bytes_per_layer, step_traffic

GB80 = 80_000_000_000


def test_cp_sits_between_dp_and_tp_and_leaves_the_3d_grid_alone():
    sizes = {"pp": 2, "dp": 2, "cp": 2, "tp": 2}
    assert grid.group_ranks("tp", sizes)[:2] == [[0, 1], [2, 3]]
    assert grid.group_ranks("cp", sizes)[:2] == [[0, 2], [1, 3]]                 # tp apart: one node's neighbours
    assert grid.group_ranks("dp", sizes)[:2] == [[0, 4], [1, 5]]                 # tp·cp apart
    assert grid.coordinates(5, {"pp": 1, "dp": 2, "cp": 2, "tp": 2}) == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}
    assert [grid.block(d, sizes) for d in ("tp", "cp", "dp", "pp")] == [2, 4, 8, 16]
    three = {"pp": 2, "dp": 2, "tp": 2}                                          # without cp: exactly as before
    assert grid.group_ranks("dp", three) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    with pytest.raises(ValueError, match="must name exactly pp, dp, cp, tp"):
        grid.coordinates(0, {"pp": 1, "dp": 1, "cp": 2, "tp": 1, "ep": 1})


def test_ring_sends_n_minus_1_over_n_of_k_and_v_forward_and_twice_that_backward():
    b, s, h, e = 2, 4096, 1024, 2
    kv = 2 * b * s * h * e                                                       # the whole sequence's K and V
    for n in (1, 2, 4, 8):
        per_layer = cp_bytes_per_layer(seq=s, micro_batch=b, hidden=h, cp=n, bytes_per_element=e)
        assert per_layer == {"forward": (n - 1) * kv // n, "backward": 2 * (n - 1) * kv // n}
    assert cp_bytes_per_layer(seq=s, micro_batch=b, hidden=h, cp=4, tp=2, bytes_per_element=e)["forward"] == 3 * kv // 8
    step = step_traffic("cp", cp=4, layers=6, hidden=h, seq=s, micro_batch=b, microbatches=2, bytes_per_element=e)
    assert [(c.op, c.count, c.bytes_per_call) for c in step.collectives] == [("send", 3 * 3 * 6 * 2, kv // 4)]
    assert step.per_rank_bytes_sent == 6 * 2 * 3 * (4 - 1) * kv // 4
    with_grads = step_traffic("cp", 1000, cp=4, layers=6, hidden=h, seq=s, micro_batch=b, bytes_per_element=4)
    assert with_grads.collectives[-1].op == "all_reduce" and with_grads.collectives[-1].bytes_per_call == 4000
    with pytest.raises(ValueError, match="--strategy cp needs --cp 2 or more"):
        step_traffic("cp", layers=6, hidden=h, seq=s, micro_batch=b)
    with pytest.raises(ValueError, match="--cp 3 must divide --seq 4096"):
        cp_bytes_per_layer(seq=s, micro_batch=b, hidden=h, cp=3)


def test_activations_per_rank_fall_as_one_over_cp():
    kw = dict(seq=8192, micro_batch=1, hidden=4096, heads=32)
    for recompute in ("none", "selective", "full"):
        whole = activation_bytes_per_layer(recompute=recompute, **kw)
        assert activation_bytes_per_layer(recompute=recompute, cp=4, **kw) * 4 == whole
    # with tensor + sequence parallelism too: Korthikanti's row over the rank's s/c positions
    assert activation_bytes_per_layer(tp=8, sequence_parallel=True, cp=2, **kw) * 2 == \
        activation_bytes_per_layer(tp=8, sequence_parallel=True, **kw)
    states = estimate_memory(7_000_000_000, layers=32, hidden=4096, heads=32, seq=8192, micro_batch=1, cp=4)
    alone = estimate_memory(7_000_000_000, layers=32, hidden=4096, heads=32, seq=8192, micro_batch=1)
    assert states.params_bytes == alone.params_bytes and states.activations_bytes * 4 == alone.activations_bytes
