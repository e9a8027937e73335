"""Ring collectives built from isend/irecv: equal to torch's, and each rank sends exactly the ring's bytes.

One launch of 4 ranks checks three rings at once — the world (n=4), ranks [0, 1, 2] (n=3) and ranks [1, 3]
(n=2, so a rank's neighbours are not its global neighbours) — on many lengths, even and uneven. Rank 0
publishes what every rank saw; the assertions recompute each number from the formula.
"""
import itertools

import pytest
import torch

from partrain_edu import runtime
from partrain_edu.launcher import torchrun
from partrain_edu.parallel.ring import chunk_bounds, ring_all_reduce, ring_bytes_sent_by
from partrain_edu.theory.traffic import ring_bytes_sent

LENGTHS = [1, 3, 5, 7, 12, 1000]

SCRIPT = r"""
import torch, torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.parallel.ring import ring_all_reduce, ring_all_gather, ring_reduce_scatter, chunk_bounds

ctx = runtime.init()
r = ctx.rank
groups = {"world": None, "three": dist.new_group([0, 1, 2]), "pair": dist.new_group([1, 3])}
members = {"world": [0, 1, 2, 3], "three": [0, 1, 2], "pair": [1, 3]}
lengths = %(lengths)r
mine = {}
for name, group in groups.items():
    if r not in members[name]:
        continue
    me, n = dist.get_rank(group), dist.get_world_size(group)
    for length in lengths:
        for dtype in (torch.float64, torch.int64):
            gen = torch.Generator().manual_seed(100 * r + length)
            data = torch.randint(-50, 50, (length,), generator=gen).to(dtype)
            expected = data.clone()
            dist.all_reduce(expected, group=group)
            tracer = CommTracer()
            with tracer:
                got = data.clone()
                ring_all_reduce(got, group=group)
            ours = data.clone()
            own = ring_reduce_scatter(ours, group=group)
            start, end = chunk_bounds(length, n)[me]
            own_ok = torch.equal(own, expected[start:end])
            gathered = torch.zeros_like(data)
            gathered[start:end] = expected[start:end]       # only my chunk is known before the gather
            ring_all_gather(gathered, group=group)
            mine[(name, length, str(dtype))] = {
                "n": n, "me": me, "equal": torch.equal(got, expected), "own_chunk": own_ok,
                "gather": torch.equal(gathered, expected), "sent": tracer.total_sent(),
                "isends": sum(rec.op == "isend" for rec in tracer.records),
                "ops": sorted({rec.op for rec in tracer.records}),
                "peers": sorted({rec.peer for rec in tracer.records if rec.op == "isend"})}
# A (3, 5) float32 tensor, all-reduced in place through its shape, and a replay log of the ring on the world.
shaped = torch.arange(15, dtype=torch.float32).view(3, 5) * (r + 1)
ring_all_reduce(shaped)
log = []
ring_all_reduce(torch.full((8,), float(2 ** r)), log=log)
mine["shaped"] = torch.equal(shaped, torch.arange(15, dtype=torch.float32).view(3, 5) * 10)
mine["log"] = [(row["phase"], row["step"], row["sent_chunk"], row["received_chunk"], row["tensor"].tolist())
               for row in log]
everyone = [None] * ctx.world_size
dist.all_gather_object(everyone, mine)
runtime.publish("result", everyone)
"""


@pytest.fixture(scope="module")
def ranks():
    return torchrun(SCRIPT % {"lengths": LENGTHS}, nproc=4, timeout=180, echo=None).published["result"]


def test_ring_all_reduce_equals_torch_on_every_ring_and_length(ranks):
    checked = 0
    for rank in ranks:
        for key, seen in rank.items():
            if isinstance(key, tuple):
                assert seen["equal"] and seen["own_chunk"] and seen["gather"], (key, seen)
                checked += 1
        assert rank["shaped"]
    assert checked == 2 * len(LENGTHS) * (4 + 3 + 2)   # every member of every ring, two dtypes


def test_each_rank_sends_the_ring_bytes_only_point_to_point(ranks):
    for global_rank, rank in enumerate(ranks):
        for (name, length, _), seen in ((k, v) for k, v in rank.items() if isinstance(k, tuple)):
            n, me = seen["n"], seen["me"]
            size = 8  # float64 and int64
            assert seen["ops"] == ["irecv", "isend"]          # nothing but point-to-point
            assert seen["sent"] == ring_bytes_sent_by(me, length, size, n)
            if length % n == 0:                                # an even split: exactly 2(n−1)/n · S
                assert seen["sent"] == ring_bytes_sent("all_reduce", length * size, n)
                assert seen["isends"] == 2 * (n - 1)
            # every send goes to the right neighbour in the ring, named by its global rank
            ring = {"world": [0, 1, 2, 3], "three": [0, 1, 2], "pair": [1, 3]}[name]
            assert seen["peers"] in ([], [ring[(me + 1) % n]]), (name, global_rank, seen["peers"])


def test_the_replay_log_shows_reduce_scatter_then_all_gather(ranks):
    # Rank r starts with 2**r everywhere, so a value's bits say which ranks it has summed.
    for r, rank in enumerate(ranks):
        log = rank["log"]
        assert [(row[0], row[1]) for row in log] == [("reduce-scatter", s) for s in range(3)] + \
                                                    [("all-gather", s) for s in range(3)]
        after_reduce_scatter = log[2][4]
        start, end = chunk_bounds(8, 4)[r]
        assert after_reduce_scatter[start:end] == [15.0] * (end - start)   # chunk r: all four ranks
        assert log[-1][4] == [15.0] * 8
        assert [row[2] for row in log[:3]] == [(r - s - 1) % 4 for s in range(3)]


@pytest.mark.parametrize("numel, n", [(10, 4), (3, 4), (0, 2), (12, 3), (1001, 8)])
def test_chunks_cover_the_tensor_like_tensor_split(numel, n):
    bounds = chunk_bounds(numel, n)
    sizes = [end - start for start, end in bounds]
    assert sizes == [len(c) for c in torch.arange(numel).tensor_split(n)]
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    # the bytes formula adds up to 2(n−1)/n of the tensor over the ring
    total = sum(ring_bytes_sent_by(r, numel, 4, n) for r in range(n))
    assert total == 2 * (n - 1) * numel * 4


def test_world_of_one_and_bad_input():
    runtime.init()
    try:
        t = torch.arange(6.0)
        assert torch.equal(ring_all_reduce(t), torch.arange(6.0))      # nothing to add
        with pytest.raises(ValueError, match="contiguous"):
            ring_all_reduce(torch.ones(4, 4).t())
    finally:
        runtime.shutdown()
