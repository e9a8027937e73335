"""DDP from scratch: buckets and hooks (in process), then the oracle — at 4 ranks, with 1, 2 and many
buckets, with gradient accumulation, the naive per-parameter variant and PyTorch's DDP, losses and final
parameters equal `single`'s — and the traffic equals `theory.traffic`. One launch runs every
variant and every multi-rank check; rank 0 publishes, the assertions below compare.
"""
import json
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.data import SyntheticTokens
from partrain_edu.launcher import torchrun
from partrain_edu.models import TinyGPT, TinyMLP
from partrain_edu.parallel.buckets import GradBucketHooks, plan_buckets
from partrain_edu.strategies import tensor_bytes
from partrain_edu.strategies.single import Single
from partrain_edu.theory.traffic import step_traffic
from partrain_edu.train import launch

STEPS = 3
GRAD_BYTES = tensor_bytes(TinyGPT().parameters())     # 873,984: fp32 gradients of every parameter
N_TENSORS = len(list(TinyGPT().parameters()))         # 69 parameter tensors
CTX = runtime.ParallelContext(0, 1, 0, torch.device("cpu"), "gloo", 60.0)


# -- buckets and hooks, no process group ------------------------------------------------------------------
def test_buckets_pack_parameters_in_reverse_order_up_to_the_cap():
    params = list(TinyGPT().parameters())
    one = plan_buckets(params, cap_bytes=1 << 40)
    assert len(one) == 1 and one[0].params == params[::-1] and one[0].nbytes == GRAD_BYTES
    many = plan_buckets(params, cap_bytes=1)
    assert [b.params for b in many] == [[p] for p in reversed(params)]
    capped = plan_buckets(params, cap_bytes=256 * 1024)
    assert [p for b in capped for p in b.params] == params[::-1]
    # each bucket but the last reached the cap with its last parameter, and not before it
    for b in capped[:-1]:
        assert b.nbytes >= 256 * 1024 > b.nbytes - b.params[-1].numel() * 4
    with pytest.raises(ValueError, match="bucket_cap_bytes must be a positive"):
        plan_buckets(params, 0)


def test_pack_gives_zeros_for_a_missing_gradient_and_unpack_writes_back():
    a, b = nn.Parameter(torch.ones(2, 3)), nn.Parameter(torch.ones(4))
    (bucket,) = plan_buckets([a, b], cap_bytes=1 << 20)
    b.grad = torch.arange(4.0)
    assert bucket.pack().tolist() == [0, 1, 2, 3] + [0] * 6          # b first: reverse order
    bucket.buffer.mul_(10)
    bucket.unpack()
    assert b.grad.tolist() == [0, 10, 20, 30] and a.grad.shape == (2, 3) and a.grad.abs().sum() == 0


class Recorder:
    def __init__(self, model, cap):
        self.events = []
        self.buckets = plan_buckets(list(model.parameters()), cap)
        self.hooks = GradBucketHooks(self.buckets, launch=lambda b: self.events.append(b.index),
                                     finish=lambda: self.events.append("finish"))


def test_hooks_launch_every_bucket_in_order_during_backward_then_finish_once():
    model = TinyMLP((8, 16, 16, 4))
    rec = Recorder(model, cap=1)                                     # one bucket per parameter
    model(torch.randn(3, 8)).sum().backward()
    assert rec.events == list(range(len(rec.buckets))) + ["finish"]
    rec.events.clear()
    rec.hooks.enabled = False                                        # no_sync: nothing at all
    model(torch.randn(3, 8)).sum().backward()
    assert rec.events == []
    rec.hooks.enabled = True
    model.net[0].weight.requires_grad_(False)                        # a parameter that gets no gradient:
    model(torch.randn(3, 8)).sum().backward()                        # its bucket still goes, at the end
    assert rec.events == list(range(len(rec.buckets))) + ["finish"]
    rec.hooks.remove()
    model(torch.randn(3, 8)).sum().backward()
    assert rec.events == list(range(len(rec.buckets))) + ["finish"]  # unchanged: hooks removed


# -- the multi-process oracle -----------------------------------------------------------------------------
SCRIPT = r"""
import sys
import torch, torch.distributed as dist, torch.nn as nn
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.config import TrainConfig
from partrain_edu.parallel.ddp import DistributedDataParallel
from partrain_edu.strategies import get_strategy
from partrain_edu.strategies.ddp import DDP, NaiveDDP
from partrain_edu.train import run

ctx = runtime.init()
n, r, steps = ctx.world_size, ctx.rank, int(sys.argv[1])
data = SyntheticTokens()
out = {}

def train(strategy, cfg):
    report = run(ctx, cfg, strategy=strategy)   # the CLI's own loop: losses and traced comm per step
    losses, comm = report["losses"], report["comm"]
    params = [p.detach().clone() for p in strategy.model.parameters()]
    sums = [None] * n
    dist.all_gather_object(sums, float(sum(p.double().sum() for p in params)))
    return {"losses": losses, "comm": comm, "params": params, "same_on_all_ranks": len(set(sums)) == 1}

half = sum(p.numel() * 4 for p in TinyGPT().parameters()) // 2
variants = [("ddp, 1 bucket", lambda c: DDP(ctx, c, bucket_cap_bytes=1 << 40), 1),
            ("ddp, 2 buckets", lambda c: DDP(ctx, c, bucket_cap_bytes=half), 2),
            ("ddp, many buckets", lambda c: DDP(ctx, c, bucket_cap_bytes=1), 1),
            ("ddp", lambda c: DDP(ctx, c), 2),
            ("ddp-naive", lambda c: NaiveDDP(ctx, c), 2),
            ("torch-ddp", lambda c: get_strategy("torch-ddp")(ctx, c), 2)]
for label, make, microbatches in variants:
    cfg = TrainConfig(strategy="ddp", nproc=n, steps=steps, microbatches=microbatches)
    strategy = make(cfg)
    out[label] = train(strategy, cfg)
    if isinstance(strategy.model, DistributedDataParallel):
        out[label]["buckets"] = len(strategy.model.buckets)
        out[label]["timeline"] = strategy.model.timeline

# Broadcast at wrap time: ranks that start different end up with rank 0's parameters.
model = TinyGPT()
with torch.no_grad():
    for p in model.parameters():
        p.add_(r)
ddp = DistributedDataParallel(model)
sums = [None] * n
dist.all_gather_object(sums, float(sum(p.double().sum() for p in model.parameters())))
out["broadcast"] = (len(set(sums)) == 1
                    and abs(sums[0] - float(sum(p.double().sum() for p in TinyGPT().parameters()))) < 1e-9)

# no_sync: nothing is sent and gradients differ across ranks; the next synced backward makes them equal.
x, y = data.global_batch(0, 2 * n)
mine = slice(2 * r, 2 * r + 2)
tracer = CommTracer()
with tracer:
    with ddp.no_sync():
        TinyGPT.loss(ddp(x[mine]), y[mine]).backward()
    quiet = len(tracer.records)
    norms = [None] * n
    dist.all_gather_object(norms, float(ddp.module.head.weight.grad.norm()))
    TinyGPT.loss(ddp(x[mine]), y[mine]).backward()
    loud = [rec.op for rec in tracer.records[quiet + 1:]]    # after the all_gather_object above
synced = [None] * n
dist.all_gather_object(synced, ddp.module.head.weight.grad.sum().item())
out["no_sync"] = {"records_inside": quiet, "differ_inside": len(set(norms)) == n,
                  "ops_after": sorted(set(loud)), "calls_after": len(loud), "equal_after": len(set(synced)) == 1}

# Parameters without a gradient: `b` is used on odd ranks only, `ghost` never.
class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.ghost = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)
    def forward(self, x, use_b):
        return self.a(x) + self.b(x) if use_b else self.a(x)

def batch(k):
    return torch.randn(3, 4, generator=torch.Generator().manual_seed(k))

reference = Branchy()
(sum(reference(batch(k), k % 2 == 1).pow(2).mean() for k in range(n)) / n).backward()
unused = {}
for find in (True, False):
    ddp = DistributedDataParallel(Branchy(), find_unused_parameters=find)
    try:
        ddp(batch(r), r % 2 == 1).pow(2).mean().backward()
    except RuntimeError as error:   # without find_unused_parameters: refused, as PyTorch's DDP refuses it
        unused[find] = {"refused": "ghost.weight" in str(error) and "find_unused_parameters=True" in str(error)}
        continue
    got = dict(ddp.module.named_parameters())
    unused[find] = {
        "used_match": all(torch.allclose(got[k].grad, p.grad, atol=1e-7) for k, p in reference.named_parameters()
                          if not k.startswith("ghost")),
        "ghost": None if got["ghost.weight"].grad is None else float(got["ghost.weight"].grad.abs().sum())}
out["unused"] = unused
runtime.publish("result", out)
"""


@pytest.fixture(scope="module")
def single():
    cfg = TrainConfig(steps=STEPS)
    strategy, data, losses = Single(CTX, cfg), SyntheticTokens(), []
    for step in range(STEPS):
        loss_sum, count = strategy.train_step(*data.global_batch(step, cfg.global_batch))
        losses.append(loss_sum / count)
    return {"losses": losses, "params": [p.detach().clone() for p in strategy.model.parameters()]}


@pytest.fixture(scope="module", params=[4])
def ranks(request):
    n = request.param
    return n, torchrun(SCRIPT, nproc=n, args=[str(STEPS)], timeout=240, echo=None).published["result"]


VARIANTS = ["ddp, 1 bucket", "ddp, 2 buckets", "ddp, many buckets", "ddp", "ddp-naive", "torch-ddp"]


def test_every_variant_equals_single(single, ranks):
    n, result = ranks
    for label in VARIANTS:
        run = result[label]
        assert run["losses"] == pytest.approx(single["losses"], rel=1e-5, abs=1e-6), label
        assert run["same_on_all_ranks"], label
        # AdamW turns float32 rounding in a zero-mean gradient (e.g. a key bias) into steps of up to lr·1;
        # 1e-4 is far below the 3 steps × lr = 9e-3 training moved the parameters by.
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(run["params"], single["params"],
                                                                              strict=True)), label
    assert [result[label]["buckets"] for label in VARIANTS[:3]] == [1, 2, N_TENSORS]


def test_traffic_is_the_ring_all_reduce_of_the_gradients(ranks):
    n, result = ranks
    theory = step_traffic("ddp", params=GRAD_BYTES // 4, dp=n, bytes_per_element=4).per_rank_bytes_sent
    assert theory == 2 * (n - 1) * GRAD_BYTES // n
    for label in VARIANTS:
        calls = {"ddp-naive": N_TENSORS, "torch-ddp": 1}.get(label, result[label].get("buckets"))
        # one call per bucket (or per parameter) per step, however many micro-batches: no_sync holds the rest
        assert result[label]["comm"] == {"all_reduce": {"calls": calls, "bytes": theory}}, label


def test_buckets_overlap_backward(ranks):
    _, result = ranks
    for label in ("ddp, 2 buckets", "ddp, many buckets"):
        timeline = result[label]["timeline"]
        assert len(timeline) == STEPS                    # one synchronised backward per step
        for step in timeline:
            buckets = step["buckets"]
            assert [b["bucket"] for b in buckets] == list(range(result[label]["buckets"]))
            launched = [b["launched"] for b in buckets]
            assert launched == sorted(launched) and 0 <= launched[0]
            # the first bucket left while autograd was still computing the earlier layers' gradients
            assert launched[0] < step["compute_end"] <= step["synced"]
            assert all(b["launched"] < b["finished"] <= step["synced"] for b in buckets)
            assert sum(b["bytes"] for b in buckets) == GRAD_BYTES


def test_broadcast_no_sync_and_unused_parameters(ranks):
    n, result = ranks
    assert result["broadcast"]
    assert result["no_sync"] == {"records_inside": 0, "differ_inside": True, "ops_after": ["all_reduce"],
                                 "calls_after": 1, "equal_after": True}     # TinyGPT: 1 bucket of 25 MiB
    # `b` is used by odd ranks only: its averaged gradient is still the whole batch's
    assert result["unused"][True] == {"used_match": True, "ghost": None}    # no rank used it: no gradient
    assert result["unused"][False] == {"refused": True}     # without it, a zero would move `ghost`: refused


def test_cli_ddp_on_4_ranks_equals_single_and_sends_the_theory():
    done = subprocess.run([sys.executable, "-m", "partrain_edu", "train", "--strategy", "ddp", "--nproc", "4",
                           "--steps", "20", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    ddp = json.loads(done.stdout)
    reference = launch(TrainConfig(strategy="single", steps=20))
    assert ddp["losses"] == pytest.approx(reference["losses"], rel=1e-5, abs=1e-5)
    sent = step_traffic("ddp", params=GRAD_BYTES // 4, dp=4, bytes_per_element=4).per_rank_bytes_sent
    assert ddp["comm"] == {"all_reduce": {"calls": 1, "bytes": sent}} and sent == 3 * GRAD_BYTES // 2
    assert ddp["state_bytes"] == reference["state_bytes"]          # a full replica on every rank
