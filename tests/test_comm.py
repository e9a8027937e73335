"""CommTracer: what it records, the ring cost model's numbers, and that tracing changes nothing.

In-process tests use a world of one (HashStore, no port). The multi-process test runs one script on 4 ranks
through `partrain_edu.launcher.oneshot.torchrun`; the script gathers every rank's records to
rank 0, which publishes them, and the assertions below recompute each number from the formula.
"""
import dataclasses

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from partrain_edu.comm import CommRecord, CommTracer
from partrain_edu.comm import costs as comm_costs
from partrain_edu.comm import tracer as comm_tracer
from partrain_edu.launcher import torchrun


def patched_names() -> dict:
    """The current value of every traced attribute of both modules, by (module, name)."""
    return {(m.__name__, name): vars(m)[name] for m in (dist, c10d) for name in comm_tracer._TRACED if name in vars(m)}


@pytest.fixture
def world1():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_world1_records_ops_payloads_and_zero_ring_bytes(world1):
    tracer = CommTracer()
    with tracer:
        with tracer.label("fwd"):
            dist.all_reduce(torch.ones(1000))                                    # 4000 B
            dist.all_gather_into_tensor(torch.empty(10), torch.ones(10))         # 40 B
        dist.reduce_scatter_tensor(torch.empty(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64))
        tracer.step()
        dist.broadcast(torch.ones(3, dtype=torch.int8), src=0)                   # 3 B
        dist.all_gather([torch.empty(7)], torch.ones(7))                         # 28 B
        dist.all_to_all_single(torch.empty(6), torch.ones(6))                    # 24 B
        dist.barrier()
        objects = [None]
        dist.all_gather_object(objects, {"loss": 1.0})
    ops = [r.op for r in tracer.records]
    # reduce_scatter_tensor calls reduce_scatter_single and all_gather_object calls all_gather inside: each
    # outer call is counted once, under its own name.
    assert ops == ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast", "all_gather",
                   "all_to_all_single", "barrier", "all_gather_object"]
    assert [r.bytes for r in tracer.records[:7]] == [4000, 40, 40, 3, 28, 24, 0]
    assert tracer.records[7].bytes > 0                  # the pickled object and its size tensor
    assert all(r.sent == 0 and r.received == 0 for r in tracer.records)   # one rank: nothing moves
    assert all(r.group_size == 1 and r.group_ranks == (0,) for r in tracer.records)
    assert [r.step for r in tracer.records] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert [r.label for r in tracer.records[:3]] == ["fwd", "fwd", None]
    assert tracer.records[3].peer == 0                  # broadcast's root
    assert objects == [{"loss": 1.0}]
    with pytest.raises(dataclasses.FrozenInstanceError):
        tracer.records[0].sent = 1
    assert tracer.summary()["all_reduce"] == {"calls": 1, "bytes": 0}
    assert tracer.total_sent() == 0


def test_paused_calls_are_not_recorded_and_results_are_unchanged(world1):
    tracer = CommTracer()
    x = torch.arange(4.0)
    with tracer:
        with tracer.paused():
            dist.all_reduce(x)
            dist.all_gather_object([None], 1)
        dist.all_reduce(x, op=dist.ReduceOp.MAX)
    assert [r.op for r in tracer.records] == ["all_reduce"]
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_patched_functions_restored_after_exit_and_after_an_exception(world1):
    before = patched_names()
    assert len(before) >= 2 * 20
    tracer = CommTracer()
    with tracer:
        inside = patched_names()
        assert all(inside[k] is not before[k] for k in before)
        assert dist.all_reduce is c10d.all_reduce   # one wrapper per function: identity checks inside torch hold
    assert all(patched_names()[k] is before[k] for k in before)
    with pytest.raises(ZeroDivisionError):
        with tracer:
            dist.all_reduce(torch.ones(2))
            raise ZeroDivisionError("raised inside the tracer")
    assert all(patched_names()[k] is before[k] for k in before)
    assert [r.op for r in tracer.records] == ["all_reduce"]   # re-entering a tracer keeps its records
    captured = inside[("torch.distributed", "all_reduce")]
    captured(torch.ones(2))                                 # a wrapper kept past exit just calls through
    assert len(tracer.records) == 1


def test_a_second_active_tracer_is_refused(world1):
    first, before = CommTracer(), patched_names()
    with first:
        with pytest.raises(RuntimeError, match="already active"):
            with CommTracer():
                pass
        dist.all_reduce(torch.ones(1))
    assert len(first.records) == 1
    assert all(patched_names()[k] is before[k] for k in before)


def test_a_call_torch_rejects_is_not_recorded(world1):
    tracer = CommTracer()
    with tracer:
        with pytest.raises(RuntimeError, match="invalid tensor size"):
            dist.all_gather_into_tensor(torch.empty(3), torch.ones(2))   # wrong output size
    assert tracer.records == []


def record(op, sent, step):
    return CommRecord(op, sent, sent, 0, 2, (0, 1), None, step, None)


def test_summary_per_step_averages_completed_steps_with_integer_division():
    tracer = CommTracer()
    with pytest.raises(ValueError, match="no completed step"):
        tracer.summary(per_step=True)
    tracer.records += [record("all_reduce", 100, 0), record("all_reduce", 100, 0), record("send", 7, 0),
                       record("all_reduce", 101, 1), record("all_reduce", 999, 2)]   # step 2 is still open
    tracer.step(), tracer.step()
    assert tracer.steps == 2
    assert tracer.summary() == {"all_reduce": {"calls": 4, "bytes": 1300}, "send": {"calls": 1, "bytes": 7}}
    assert tracer.summary(per_step=True) == {"all_reduce": {"calls": 1, "bytes": 150},
                                             "send": {"calls": 0, "bytes": 3}}
    assert tracer.total_sent(per_step=True) == 153


def test_merge_without_a_process_group_and_in_a_world_of_one(world1):
    tracer = CommTracer()
    with tracer:
        dist.all_reduce(torch.ones(1))
        tracer.step()
        merged = tracer.merge(per_step=True)
    assert merged["per_rank"] == [{"rank": 0, "sent": 0, "summary": {"all_reduce": {"calls": 1, "bytes": 0}}}]
    assert merged["max_sender"] == merged["per_rank"][0]
    assert [r.op for r in tracer.records] == ["all_reduce"]          # merging is not recorded
    assert tracer.summary_of_max_sender() == {"all_reduce": {"calls": 1, "bytes": 0}}


def test_merge_without_any_process_group():
    assert not dist.is_initialized()
    tracer = CommTracer()
    assert tracer.merge() == {"per_rank": [{"rank": 0, "sent": 0, "summary": {}}],
                              "max_sender": {"rank": 0, "sent": 0, "summary": {}}}


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_formulas_round_down(n):
    group = comm_costs.Group(n, 1, 1, tuple(range(n)))
    t = torch.empty(1001, dtype=torch.uint8)                            # S = 1001 B: not divisible by n
    def cost(op, **arguments):
        return comm_costs.COSTS[op](arguments, group)

    up = lambda x: -(-x // n)  # noqa: E731  ring bytes round up (as theory.traffic does)
    assert cost("all_reduce", tensor=t)[:3] == (1001, up(2 * (n - 1) * 1001), up(2 * (n - 1) * 1001))
    assert cost("all_gather_into_tensor", output_tensor=t)[1] == up((n - 1) * 1001)
    assert cost("reduce_scatter", input_list=[t, t])[:2] == (2002, up((n - 1) * 2002))
    assert cost("broadcast", tensor=t, src=0, group_src=None) == (1001, 1001, 1001, 0)
    assert cost("broadcast", tensor=t, src=None, group_src=1) == (1001, 1001, 0, 1)   # this rank is the root
    assert cost("all_to_all_single", input=torch.empty(10 * n), output=torch.empty(10 * n),
                input_split_sizes=None, output_split_sizes=None)[1] == (n - 1) * 40 * n // n
    assert cost("isend", tensor=t, dst=None, group_dst=0) == (1001, 1001, 0, 0)
    assert cost("irecv", tensor=t, src=None, group_src=None) == (1001, 0, 1001, None)   # from any rank


# --- a real run on 4 ranks -----------------------------------------------------------------------------

SCRIPT = r"""
import copy, dataclasses, gc
import torch, torch.distributed as dist, torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.comm.ddp_hook import traced_allreduce_hook

ctx = runtime.init(backend="gloo")
rank, n = ctx.rank, ctx.world_size
nxt, prv = (rank + 1) % n, (rank - 1) % n
pair = dist.new_group([0, 1])                                    # every rank takes part in creating it
early_buf = torch.empty(64)
early = [dist.P2POp(dist.isend, torch.full((64,), float(rank)), nxt),   # built before the tracer
         dist.P2POp(dist.irecv, early_buf, prv)]

tracer = CommTracer()
with tracer:
    with tracer.label("collectives"):
        x = torch.ones(1000)                                                  # S = 4000 B
        dist.all_reduce(x)
        full = torch.empty(n * 250)
        dist.all_gather_into_tensor(full, torch.full((250,), float(rank)))   # S = 1000n B (the output)
        part = torch.empty(250)
        dist.reduce_scatter_tensor(part, torch.ones(n * 250))                # S = 1000n B (the input)
        dist.broadcast(x, src=0)
        out = torch.empty(n * (rank + 1))                                     # rank r sends j+1 floats to j
        inp = torch.cat([torch.full((j + 1,), float(rank)) for j in range(n)])
        dist.all_to_all_single(out, inp, [rank + 1] * n, [j + 1 for j in range(n)])
        y = torch.full((250,), float(rank))
        dist.all_reduce(y, group=pair)                                        # ranks 2, 3 are not members
        dist.broadcast(y, group=pair, group_src=1)
    assert x[0] == n and full.view(n, 250)[:, 0].tolist() == list(range(n)) and part[0] == n
    assert out.view(n, rank + 1)[:, 0].tolist() == list(range(n))
    tracer.step()
    with tracer.label("p2p"):
        msg, got = torch.full((100,), float(rank)), torch.empty(100)        # 400 B around the ring
        if rank % 2 == 0:                                                     # Gloo's blocking send waits
            dist.send(msg, nxt); dist.recv(got, prv)                          # for its recv: alternate
        else:
            dist.recv(got, prv); dist.send(msg, nxt)
        inside_buf = torch.empty(32, dtype=torch.float64)
        inside = [dist.P2POp(dist.irecv, inside_buf, prv),
                  dist.P2POp(dist.isend, torch.full((32,), float(rank), dtype=torch.float64), nxt)]
        for work in dist.batch_isend_irecv(early) + dist.batch_isend_irecv(inside):
            work.wait()
        del early, inside, work      # a P2POp holds its process group: see the note at the end
        if rank == n - 1:
            dist.send(torch.ones(2000), 0)                                   # 8000 B: the max sender
        if rank == 0:
            dist.recv(torch.empty(2000), n - 1)
    assert got[0] == prv and early_buf[0] == prv and inside_buf[0] == prv
    tracer.step()
    with tracer.paused():
        dist.all_reduce(torch.ones(10))                                       # reporting: not counted
    merged = tracer.merge()

# PyTorch DDP with the traced hook against one process on the whole batch.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
reference = copy.deepcopy(model)
ddp = DistributedDataParallel(model)
ddp.register_comm_hook(None, traced_allreduce_hook)
grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1)
b = 8 // n
max_grad_diff = 0.0
ddp_tracer = CommTracer()
with ddp_tracer:
    for step in range(3):
        X, Y = torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data)   # the global batch
        opt.zero_grad()
        loss = F.mse_loss(ddp(X[rank * b:(rank + 1) * b]), Y[rank * b:(rank + 1) * b])
        loss.backward()
        ref_opt.zero_grad()
        F.mse_loss(reference(X), Y).backward()
        for p, q in zip(model.parameters(), reference.parameters()):
            max_grad_diff = max(max_grad_diff, (p.grad - q.grad).abs().max().item())
        opt.step()
        ref_opt.step()
        ddp_tracer.step()
        with ddp_tracer.paused():
            dist.all_reduce(loss.detach())
    ddp_comm = ddp_tracer.summary_of_max_sender()

# Anything holding a process group (DDP, a P2POp, a subgroup handle) keeps it, and its Gloo worker threads,
# alive past runtime.shutdown(). Then a worker may free the last collective's tensors while Python is already
# finalizing, which aborts the process ("terminate called without an active exception"; torch 2.13, about
# 1 run in 5 at 4 ranks). Dropping those references lets shutdown() join the workers first.
del ddp, pair
gc.collect()
everyone = [None] * n
dist.all_gather_object(everyone, [dataclasses.asdict(r) for r in tracer.records])
runtime.publish("result", {"records": everyone, "merged": merged, "per_step": tracer.summary(per_step=True),
                           "ddp": ddp_tracer.summary(per_step=True), "ddp_comm": ddp_comm,
                           "grad_bytes": grad_bytes, "max_grad_diff": max_grad_diff})
runtime.shutdown()
"""


def expected_records(rank: int, n: int) -> list[tuple]:
    """(op, bytes, sent, received, peer, group_size, step, label) that `SCRIPT` must record on `rank`."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    ring = lambda factor, S, size=n: -(-factor * (size - 1) * S // size)   # noqa: E731
    tri = n * (n + 1) // 2                          # floats in this rank's all_to_all input
    rows = [
        ("all_reduce", 4000, ring(2, 4000), ring(2, 4000), None, n, 0, "collectives"),
        ("all_gather_into_tensor", 1000 * n, ring(1, 1000 * n), ring(1, 1000 * n), None, n, 0, "collectives"),
        ("reduce_scatter_tensor", 1000 * n, ring(1, 1000 * n), ring(1, 1000 * n), None, n, 0, "collectives"),
        ("broadcast", 4000, 4000, 0 if rank == 0 else 4000, 0, n, 0, "collectives"),
        ("all_to_all_single", 4 * tri, 4 * (tri - (rank + 1)), 4 * (rank + 1) * (n - 1), None, n, 0,
         "collectives"),
    ]
    if rank < 2:
        rows += [("all_reduce", 1000, 1000, 1000, None, 2, 0, "collectives"),   # 2(2-1)/2 S = S
                 ("broadcast", 1000, 1000, 0 if rank == 1 else 1000, 1, 2, 0, "collectives")]
    send, recv = ("send", 400, 400, 0, nxt, n, 1, "p2p"), ("recv", 400, 0, 400, prv, n, 1, "p2p")
    rows += [send, recv] if rank % 2 == 0 else [recv, send]
    rows += [("isend", 256, 256, 0, nxt, n, 1, "p2p"), ("irecv", 256, 0, 256, prv, n, 1, "p2p"),
             ("irecv", 256, 0, 256, prv, n, 1, "p2p"), ("isend", 256, 256, 0, nxt, n, 1, "p2p")]
    if rank == n - 1:
        rows.append(("send", 8000, 8000, 0, 0, n, 1, "p2p"))
    if rank == 0:
        rows.append(("recv", 8000, 0, 8000, n - 1, n, 1, "p2p"))
    return rows


@pytest.mark.parametrize("n", [4])
def test_traced_run_on_n_ranks_matches_the_ring_model(n):
    result = torchrun(SCRIPT, nproc=n, timeout=180, echo=None).published["result"]
    for rank, records in enumerate(result["records"]):
        got = [(r["op"], r["bytes"], r["sent"], r["received"], r["peer"], r["group_size"], r["step"], r["label"])
               for r in records]
        assert got == expected_records(rank, n), f"rank {rank}"
        assert all(tuple(r["group_ranks"]) == (tuple(range(n)) if r["group_size"] == n else (0, 1))
                   for r in records)

    # merge(): every rank's totals, and the max sender is the last rank (its extra 8000 B send).
    sent = [sum(row[2] for row in expected_records(rank, n)) for rank in range(n)]
    merged = result["merged"]
    assert [d["rank"] for d in merged["per_rank"]] == list(range(n))
    assert [d["sent"] for d in merged["per_rank"]] == sent
    assert merged["max_sender"]["rank"] == n - 1 == max(range(n), key=lambda r: (sent[r], -r))
    assert merged["max_sender"]["summary"]["send"] == {"calls": 2, "bytes": 8400}

    # Rank 0 per step (2 steps, integer division); the paused all-reduce is not in it.
    assert result["per_step"]["all_reduce"] == {"calls": 1, "bytes": (2 * (n - 1) * 4000 // n + 1000) // 2}
    assert result["per_step"]["isend"] == {"calls": 1, "bytes": 256}

    # PyTorch DDP through traced_allreduce_hook: one bucket per step, 2(n-1)/n of the gradient bytes, and the
    # averaged gradients equal the single-process ones.
    grad_bytes = (16 * 32 + 32 + 32 * 4 + 4) * 4
    assert result["grad_bytes"] == grad_bytes
    assert result["ddp"] == {"all_reduce": {"calls": 1, "bytes": 2 * (n - 1) * grad_bytes // n}}
    assert result["ddp_comm"] == result["ddp"]
    assert result["max_grad_diff"] < 1e-6
