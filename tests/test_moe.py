"""Mixture of experts at depth (issues 9, 18): expert parallelism equals the one-process MoE with the same
routing (dropped tokens included), alone and composed with data parallelism on 4 ranks; the all-to-all and
all-reduce bytes CommTracer measures are theory.moe's and theory.traffic's; a skewed router makes one
expert's rank the busiest and a capacity factor caps it; the Switch aux loss is its formula and, trained,
evens the load.

One 4-rank launch runs every distributed check and publishes the numbers; the tests assert.
"""
import pytest
import torch

from partrain_edu.launcher import torchrun
from partrain_edu.parallel.moe import MoE
from partrain_edu.parallel.moe_routing import route, within_capacity
from partrain_edu.theory import moe as theory
from partrain_edu.theory.traffic import ring_bytes_sent

N, H, E, W = 24, 16, 4, 4  # tokens per rank, hidden size, experts, ranks
TOL = 1e-5                 # relative gap; fp32 rounding measures ≤ 1e-7

RANK_SCRIPT = r'''
import sys
import torch
import torch.distributed as dist
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.gaps import relative_gap
from partrain_edu.parallel.moe import MoE, ExpertParallelMoE, expert_parallel_groups, average_gradients

N, H, E = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
ctx = runtime.init()
W, me = ctx.world_size, ctx.rank
ep_group, dp_group = expert_parallel_groups(2)           # ranks {0,1},{2,3} share experts; {0,2},{1,3} replicas
gen = torch.Generator().manual_seed(7)
x_all, target = torch.randn(W * N, H, generator=gen), torch.randn(W * N, H, generator=gen)
mine = slice(me * N, (me + 1) * N)

def oracle(reference, x_all):
    """The one-process layer on each rank's tokens in turn (capacity is per rank), losses summed."""
    x = x_all.clone().requires_grad_()
    ys, auxes, dropped = [], [], []
    for r in range(W):
        y, aux = reference(x[r * N:(r + 1) * N], return_aux=True)
        ys, auxes, dropped = ys + [y], auxes + [aux], dropped + [reference.last.dropped]
    sum((y * target[r * N:(r + 1) * N]).sum() + a for r, (y, a) in enumerate(zip(ys, auxes))).backward()
    return x.grad, torch.cat(ys).detach(), [a.item() for a in auxes], dropped

def grad(p):                                              # an expert no token reached has no gradient
    return p.grad if p.grad is not None else torch.zeros_like(p)

def compare(layer, reference, x_all, group, dp, tracer):
    x_grad, y_ref, aux_ref, dropped_ref = oracle(reference, x_all)
    x = x_all[mine].clone().requires_grad_()
    with tracer:
        y, aux = layer(x, return_aux=True)
        ((y * target[mine]).sum() + aux).backward()
        if dp is not None:
            average_gradients(layer, dp)                  # gradients of the mean over the W ranks
    scale = W if dp is not None else 1
    router = layer.router.weight.grad.clone()
    if dp is None:
        dist.all_reduce(router)                             # (outside the tracer) the replicated router: sum
    first = dist.get_rank(group) * layer.per_rank
    ref_experts = [grad(p) / scale for e in reference.experts[first:first + layer.per_rank] for p in e.parameters()]
    return {"out": relative_gap(y, y_ref[mine]), "x_grad": relative_gap(x.grad, x_grad[mine]),
            "router_grad": relative_gap(router, reference.router.weight.grad / scale),
            "expert_grad": relative_gap([grad(p) for p in layer.experts.parameters()], ref_experts),
            "aux": (aux.item(), aux_ref[me]), "dropped": (layer.last.dropped, dropped_ref[me]),
            "load": layer.last.load.tolist(), "capacity": layer.last.capacity, "f_P": (
                (layer.last.load / layer.last.load.sum()).tolist(),
                torch.softmax(layer.router(x), -1).mean(0).tolist()),
            "ops": [(r.op, r.sent, r.group_size) for r in tracer.records],
            "sent": layer.last_sent, "received": layer.last_received, "expert_rows": layer.last_expert_rows,
            "group_rank": dist.get_rank(group),
            "bytes": {"experts": sum(p.numel() * 4 for p in layer.experts.parameters()),
                      "router": layer.router.weight.numel() * 4}}

results = {}
# expert parallelism alone over the 4 ranks, top-1, dropless (notebook 07's layer)
reference = MoE(H, E, k=1, init_seed=3)
results["ep"] = compare(ExpertParallelMoE(reference), reference, x_all, None, None, CommTracer())
# 2 expert-parallel groups × 2 data-parallel replicas, top-2, capacity factor 1: tokens are dropped
reference = MoE(H, E, k=2, init_seed=3, capacity_factor=1.0, aux_weight=1.0)
results["ep_dp"] = compare(ExpertParallelMoE(reference, group=ep_group), reference, x_all, ep_group, dp_group,
                           CommTracer())
# a skewed router: every rank prefers expert 0 (on rank 0); dropless, then capacity factor 1.25
for name, cf in (("skew", None), ("skew_capped", 1.25)):
    reference = MoE(H, E, k=1, init_seed=3, capacity_factor=cf)
    with torch.no_grad():
        reference.router.weight[0] = 0.5
    results[name] = compare(ExpertParallelMoE(reference), reference, x_all + 0.5, None, None, CommTracer())
everyone = [None] * W
dist.all_gather_object(everyone, results)
runtime.publish("moe", everyone)
runtime.shutdown()
'''


@pytest.fixture(scope="module")
def runs():
    return torchrun(RANK_SCRIPT, nproc=W, args=(str(N), str(H), str(E)), timeout=180).published["moe"]


@pytest.mark.parametrize("case", ["ep", "ep_dp", "skew", "skew_capped"])
def test_expert_parallel_equals_one_process_with_the_same_routing(runs, case):
    for rank in runs:
        r = rank[case]
        for key in ("out", "x_grad", "router_grad", "expert_grad"):
            assert r[key] < TOL, (case, key, r[key])
        assert r["aux"][0] == pytest.approx(r["aux"][1], rel=1e-6)
        assert r["dropped"][0] == r["dropped"][1] == theory.dropped(r["load"], r["capacity"])
    assert sum(rank["ep_dp"]["dropped"][0] for rank in runs) > 0       # capacity 1 did drop tokens


@pytest.mark.parametrize("case", ["ep", "ep_dp", "skew_capped"])
def test_measured_bytes_are_the_formulas(runs, case):
    for rank in runs:
        r = rank[case]
        moves = [sent for op, sent, _ in r["ops"] if op == "all_to_all_single"]
        # forward: counts, dispatch, combine; backward: combine's transpose, then dispatch's
        assert len(moves) == 5, r["ops"]
        counts, dispatch, combine, combine_back, dispatch_back = moves
        n = len(r["sent"])
        assert counts == (n - 1) * E // n * 8                              # E/n int64 counts to each other rank
        assert dispatch == combine_back == theory.dispatch_bytes(r["sent"], r["group_rank"], H)
        assert combine == dispatch_back == theory.dispatch_bytes(r["received"], r["group_rank"], H)
        reduces = [(sent, size) for op, sent, size in r["ops"] if op == "all_reduce"]
        expected = [(ring_bytes_sent("all_reduce", r["bytes"]["experts"], 2), 2),
                    (ring_bytes_sent("all_reduce", r["bytes"]["router"], W), W)] if case == "ep_dp" else []
        assert reduces == expected
    assert sum(moves[1] for moves in ([s for op, s, _ in rank[case]["ops"] if op == "all_to_all_single"]
                                      for rank in runs)) > 0          # rows did cross ranks


def test_a_skewed_router_loads_one_rank_and_capacity_caps_it(runs):
    skew, capped = ([rank[c] for rank in runs] for c in ("skew", "skew_capped"))
    rows = [r["expert_rows"][0] for r in skew]                          # one expert per rank
    assert rows[0] == sum(r["load"][0] for r in skew)                   # every rank's expert-0 tokens
    assert theory.imbalance(rows) > 2 and rows[0] == max(rows)
    assert skew[0]["received"] == [r["sent"][0] for r in skew]         # what each rank routed to expert 0
    cap = capped[0]["capacity"]
    assert cap == theory.capacity(N, E, 1, 1.25)
    assert max(r["expert_rows"][0] for r in capped) <= W * cap < rows[0]


def test_aux_loss_is_switch_formula(runs):
    for rank in runs:
        r = rank["ep_dp"]
        f, P = r["f_P"]
        assert r["aux"][0] == pytest.approx(theory.switch_aux_loss(f, P, alpha=1.0), rel=1e-6)


def test_capacity_drops_later_choices_first():
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])      # (N=4, k=2) expert ids
    # expert 0's queue: first choices of tokens 0, 1, 2, then token 3's second choice; C = 2 keeps two
    assert within_capacity(experts, 4, 2).tolist() == [[True, True], [True, True], [False, False], [True, False]]
    layer = MoE(H, E, k=2, init_seed=0, capacity_factor=0.5)
    x = torch.randn(N, H, generator=torch.Generator().manual_seed(0))
    y = layer(x)
    gone = ~layer.last.kept.any(1)                                   # tokens every expert dropped
    assert layer.last.capacity == theory.capacity(N, E, 2, 0.5) and gone.any()
    assert y[gone].abs().max() == 0 and y[~gone].abs().min() > 0      # they leave as 0: only their residual
    assert layer.last.kept_load.max() <= layer.last.capacity


def test_single_process_moe_routes_to_top_k():
    layer = MoE(H, E, k=2, init_seed=0)
    x = torch.randn(5, H, generator=torch.Generator().manual_seed(0))
    by_hand = torch.zeros(5, H)
    gates = torch.softmax(layer.router(x), dim=-1)
    for i in range(5):
        top = gates[i].topk(2)
        for w, e in zip(top.values / top.values.sum(), top.indices, strict=True):
            by_hand[i] += w * layer.experts[int(e)](x[i:i + 1])[0]
    assert torch.allclose(layer(x), by_hand, atol=1e-6)


def test_aux_loss_training_evens_a_skewed_router():
    def train(aux_weight, steps=200):
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(256, 16, generator=gen) + 0.5
        target = torch.tanh(x @ torch.randn(16, 16, generator=gen))
        layer = MoE(16, 4, k=1, hidden=32, init_seed=0, aux_weight=aux_weight)
        with torch.no_grad():
            layer.router.weight[0] = 0.5                                # every token prefers expert 0
        opt = torch.optim.Adam(layer.parameters(), lr=1e-2)
        before = theory.imbalance(route(layer.router, x, 1).load.tolist())
        for _ in range(steps):
            y, aux = layer(x, return_aux=True)
            opt.zero_grad()
            (((y - target) ** 2).mean() + aux).backward()
            opt.step()
        return before, theory.imbalance(route(layer.router, x, 1).load.tolist())

    (skewed, without), (_, with_aux) = train(0.0), train(0.05)
    assert skewed > 3.5 and without > 3.5                              # left alone, expert 0 keeps every token
    assert with_aux < 1.2


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="1 ≤ k"):
        MoE(H, E, k=5)
    with pytest.raises(ValueError, match="capacity_factor"):
        MoE(H, E, capacity_factor=0)
