"""Expert parallelism (issue 9): the expert-parallel MoE layer equals its single-process version (outputs and
every gradient, top-1 and top-2), and its all-to-all traffic is what the routing counts say.

One 2-rank launch runs every check and publishes the numbers; the tests assert.
"""
import pytest
import torch

from partrain_edu.launch import torchrun
from partrain_edu.parallel.moe import MoE, dispatch_bytes

N, H, E = 24, 16, 4  # tokens per rank, hidden size, experts

RANK_SCRIPT = r'''
import sys
import torch
import torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.parallel.moe import MoE, ExpertParallelMoE, dispatch_bytes

N, H, E = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ctx = runtime.init()
n, me = ctx.world_size, ctx.rank
results = {}
for k in (1, 2):
    reference = MoE(H, E, k=k, init_seed=3)
    x_all = torch.randn(n * N, H, generator=torch.Generator().manual_seed(7)).requires_grad_()  # (n·N, H)
    (reference(x_all) ** 2).sum().backward()                        # the single-process oracle
    layer = ExpertParallelMoE(reference, group=None)
    x = x_all.detach()[me * N:(me + 1) * N].clone().requires_grad_()  # this rank's tokens (N, H)
    with CommTracer() as tracer:
        y = layer(x)
        (y ** 2).sum().backward()
    router_grad = layer.router.weight.grad.clone()
    with tracer.paused():
        dist.all_reduce(router_grad)                                   # the router is replicated: sum
    ops = [(r.op, r.sent) for r in tracer.records]
    first = me * layer.per_rank
    expert_err = max((p.grad - q.grad).abs().max().item()
                     for mine, ref in zip(layer.experts, reference.experts[first:first + layer.per_rank])
                     for p, q in zip(mine.parameters(), ref.parameters()))
    results[k] = {
        "out_err": (y - reference(x_all)[me * N:(me + 1) * N]).abs().max().item(),
        "x_grad_err": (x.grad - x_all.grad[me * N:(me + 1) * N]).abs().max().item(),
        "expert_grad_err": expert_err,
        "router_grad_err": (router_grad - reference.router.weight.grad).abs().max().item(),
        "ops": ops, "sent_rows": layer.last_sent, "received_rows": layer.last_received,
        "expected_dispatch": dispatch_bytes(layer.last_sent, me, H),
        "expected_combine": dispatch_bytes(layer.last_received, me, H),
        "experts_here": len(layer.experts),
    }
everyone = [None] * n
dist.all_gather_object(everyone, results)
runtime.publish("moe", everyone)
runtime.shutdown()
'''


@pytest.fixture(scope="module")
def runs():
    return torchrun(RANK_SCRIPT, nproc=2, args=(str(N), str(H), str(E)), timeout=120).published["moe"]


@pytest.mark.parametrize("k", [1, 2])
def test_expert_parallel_equals_single_process(runs, k):
    for rank in runs:
        r = rank[k]
        assert r["experts_here"] == E // 2
        for key in ("out_err", "x_grad_err", "expert_grad_err", "router_grad_err"):
            assert r[key] < 1e-6, (k, key, r[key])


@pytest.mark.parametrize("k", [1, 2])
def test_all_to_all_traffic_is_the_routed_rows(runs, k):
    for me, rank in enumerate(runs):
        r = rank[k]
        assert sum(r["sent_rows"]) == N * k                          # every token goes to k experts
        token_moves = [sent for op, sent in r["ops"] if op == "all_to_all_single"]
        # forward: counts, dispatch, combine; backward: combine's transpose (the rows go out again, like
        # dispatch), then dispatch's transpose (the rows' gradients come home, like combine)
        assert len(token_moves) == 5, r["ops"]
        counts, dispatch, combine, combine_back, dispatch_back = token_moves
        assert counts == E // 2 * 8                                  # E/n int64 counts to the other rank
        assert dispatch == r["expected_dispatch"] == combine_back
        assert combine == r["expected_combine"] == dispatch_back
        assert dispatch > 0
    # what one rank sends is what the other receives
    assert runs[0][k]["sent_rows"][1] == runs[1][k]["received_rows"][0]


def test_single_process_moe_routes_to_top_k():
    layer = MoE(H, E, k=2, init_seed=0)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    by_hand = torch.zeros(5, H)
    gates = torch.softmax(layer.router(x), dim=-1)
    for i in range(5):
        top = gates[i].topk(2)
        for w, e in zip(top.values / top.values.sum(), top.indices):
            by_hand[i] += w * layer.experts[int(e)](x[i:i + 1])[0]
    assert torch.allclose(layer(x), by_hand, atol=1e-6)
    assert dispatch_bytes([3, 5], 0, H) == 5 * H * 4


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="1 ≤ k"):
        MoE(H, E, k=5)
