"""Context parallelism (issue 18): ring attention equals full attention (output, dQ, dK, dV; causal or not), on a
model the course never saw too; its bytes are the formula's; each rank keeps 1/n of the attention's activations;
zig-zag balances the causal work; `train --strategy cp` reproduces `single`.

One 4-rank launch runs the library checks and publishes the numbers; one CLI launch trains.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from partrain_edu.config import TrainConfig
from partrain_edu.launcher import torchrun
from partrain_edu.models import GPTConfig
from partrain_edu.parallel.context import Sharding
from partrain_edu.strategies import get_strategy
from partrain_edu.theory.traffic import cp_bytes_per_layer, ring_bytes_sent, step_traffic
from partrain_edu.train import launch

N, FP32, STEPS = 4, 4, 4
B, HEADS, T, HD = 2, 3, 24, 5          # odd sizes: nothing lines up by accident

RANK_SCRIPT = r'''
import sys
sys.path.insert(0, sys.argv[1])                       # tests/, for the unseen model
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.parallel.context import RingAttention, ShardedPositions, Sharding, ring_attention
from partrain_edu.parallel.sequence import SavedBytes
from partrain_edu.config import TrainConfig
from partrain_edu.strategies.context import ContextParallel
from partrain_edu.train import run
from unseen_tp_pp_models import AttentionLM

B, HEADS, T, HD = 2, 3, 24, 5
torch_sdpa = F.scaled_dot_product_attention
ctx = runtime.init()
n, me = ctx.world_size, ctx.rank
gen = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, HEADS, T, HD, generator=gen) * s for s in (3, 1, 1))   # sharp softmax
w = torch.randn(B, HEADS, T, HD, generator=gen)                                    # loss Σ out·w
out = {"errors": {}, "work": {}, "bytes": {}}
for causal in (False, True):
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*full, is_causal=causal)
    (reference * w).sum().backward()
    for zigzag in (False, True):
        sharding, log = Sharding(T, n, zigzag), []
        mine = [sharding.shard(t, me, 2).requires_grad_() for t in (q, k, v)]
        tracer = CommTracer()
        with tracer:
            with tracer.label("forward"):
                o = ring_attention(*mine, sharding=sharding, causal=causal, log=log)
            with tracer.label("backward"):
                (o * sharding.shard(w, me, 2)).sum().backward()
        expected = [reference] + [t.grad for t in full]
        out["errors"][causal, zigzag] = max((got - sharding.shard(want, me, 2)).abs().max().item() /
                                            want.abs().max().item()
                                            for got, want in zip([o] + [t.grad for t in mine], expected))
        out["work"][causal, zigzag] = sum(row["scores"] for row in log if row["pass"] == "forward")
        out["bytes"][causal, zigzag] = {p: (sum(row["sent"] for row in log if row["pass"] == p),
                                            sum(r.sent for r in tracer.records if r.label == p and r.op == "isend"),
                                            sorted({r.peer for r in tracer.records
                                                    if r.label == p and r.op == "isend"}))
                                        for p in ("forward", "backward")}

# memory: what autograd keeps for backward, ring vs full attention (saved-tensor hooks)
def kept(fn, *tensors):
    meter = SavedBytes(nn.Module())
    with torch.autograd.graph.saved_tensors_hooks(meter.keep, lambda t: t):
        result = fn(*[t.clone().requires_grad_() for t in tensors])
    return meter.total, result
sharding = Sharding(T, n)
out["kept_full"], _ = kept(lambda *t: F.scaled_dot_product_attention(*t, is_causal=True), q, k, v)
out["kept_ring"], _ = kept(lambda *t: ring_attention(*t, sharding=sharding, causal=True),
                           *(sharding.shard(t, me, 2) for t in (q, k, v)))

# a model the course never saw: bidirectional attention under other names, learned positions
model, whole = AttentionLM(), AttentionLM()
names = list(model.state_dict())
lm_sharding = Sharding(AttentionLM.SEQ, n)
ring = RingAttention(dist.group.WORLD, lm_sharding)
ring.apply(model)
model.pos = ShardedPositions(model.pos, ring.positions())
idx = torch.randint(0, AttentionLM.VOCAB, (3, AttentionLM.SEQ), generator=gen)
logits = model(ring.shard(idx))
loss = F.cross_entropy(logits.flatten(0, 1), ring.shard(idx).flatten(), reduction="sum") / idx.numel()
loss.backward()
reference = whole(idx)
F.cross_entropy(reference.flatten(0, 1), idx.flatten()).backward()
for p in model.parameters():
    dist.all_reduce(p.grad)                             # each rank's tokens' share of the gradient
out["lm"] = {"logits": (logits - ring.shard(reference)).abs().max().item(), "names": list(model.state_dict()) == names,
             "grads": max((p.grad - model_p.grad).abs().max().item()
                          for p, model_p in zip(whole.parameters(), model.parameters())),
             "sdpa_restored": F.scaled_dot_product_attention is torch_sdpa}
try:
    with ring:
        F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(T, T, dtype=torch.bool))
except ValueError as error:
    out["refusal"] = str(error)
strategy = ContextParallel(ctx, TrainConfig(strategy="cp", nproc=n, cp=n, steps=int(sys.argv[2]), microbatches=2))
out["train"] = {"losses": run(ctx, strategy.cfg, strategy=strategy)["losses"], **strategy.report_facts()}
gathered = [None] * n
dist.all_gather_object(gathered, out)
runtime.publish("results", gathered)
'''


@pytest.fixture(scope="module")
def single():
    return launch(TrainConfig(strategy="single", steps=STEPS))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    script = tmp_path_factory.mktemp("cp") / "cp_checks.py"
    script.write_text(RANK_SCRIPT)
    return torchrun(str(script), nproc=N, args=(str(Path(__file__).parent), str(STEPS)), echo=None,
                    timeout=240).published["results"]


def test_ring_attention_equals_full_attention_output_and_gradients(ranks):
    for rank in ranks:
        for (causal, zigzag), error in rank["errors"].items():
            assert error < 1e-5, (causal, zigzag, error)


def test_a_model_the_course_never_saw_runs_unchanged(ranks):
    for rank in ranks:
        lm = rank["lm"]
        assert lm["logits"] < 1e-5 and lm["grads"] < 1e-6 and lm["names"] and lm["sdpa_restored"]
        assert rank["refusal"].startswith("ring attention supports is_causal and scale only")


def test_bytes_are_n_minus_1_over_n_of_k_and_v_per_pass_to_one_neighbour(ranks):
    theory = cp_bytes_per_layer(seq=T, micro_batch=B, hidden=HEADS * HD, cp=N, bytes_per_element=FP32)
    assert theory["forward"] == (N - 1) * 2 * B * T * HEADS * HD * FP32 // N
    for me, rank in enumerate(ranks):
        for sent in rank["bytes"].values():
            for p in ("forward", "backward"):
                logged, traced, peers = sent[p]
                assert logged == traced == theory[p] and peers == [(me + 1) % N]


def test_zigzag_balances_the_causal_work(ranks):
    work = {key: [rank["work"][key] for rank in ranks] for key in ranks[0]["work"]}
    contiguous, zigzag = work[True, False], work[True, True]
    chunk = T // (2 * N)
    assert contiguous == sorted(contiguous) and contiguous[-1] == N * contiguous[0]   # the last rank: n × the first
    assert zigzag == [(2 * N + 1) * chunk**2] * N                                     # 2n+1 chunk pairs each
    assert work[False, True] == [T * T // N] * N                                       # no mask: every rank, all keys


def test_each_rank_keeps_one_nth_of_the_attention_activations(ranks):
    qkv_out, lse = 4 * B * HEADS * T * HD * FP32, B * HEADS * T * FP32
    for rank in ranks:
        assert rank["kept_full"] == qkv_out + lse             # SDPA keeps q, k, v, out and a log-sum-exp per query
        assert rank["kept_ring"] * N == rank["kept_full"]


def test_the_strategy_reports_the_ring_bytes_of_a_step(ranks, single):
    cfg = GPTConfig()
    per_layer = cp_bytes_per_layer(seq=cfg.seq_len, micro_batch=16 // 2, hidden=cfg.n_embd, cp=N,
                                   bytes_per_element=FP32)
    for rank in ranks:                     # trained with 2 micro-batches: single's losses all the same
        facts = rank["train"]["context_parallel"]
        # 2 micro-batches
        assert facts["kv_bytes_sent_per_step"] == {p: 2 * cfg.n_layer * per_layer[p] for p in per_layer}
        assert (facts["cp"], facts["zigzag"], facts["positions_per_rank"]) == (N, True, cfg.seq_len // N)
        assert rank["train"]["losses"] == pytest.approx(single["losses"], rel=1e-5, abs=1e-5)


def test_the_cli_trains_cp_on_4_ranks_like_single(single):
    done = subprocess.run([sys.executable, "-m", "partrain_edu", "train", "--strategy", "cp", "--nproc", "4", "--cp",
                           "4", "--steps", str(STEPS), "--json"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["losses"] == pytest.approx(single["losses"], rel=1e-5, abs=1e-5)
    assert report["state_bytes"] == single["state_bytes"]                # every parameter replicated
    cfg = GPTConfig()
    params = single["state_bytes"]["params"] // FP32
    theory = step_traffic("cp", params, cp=4, layers=cfg.n_layer, hidden=cfg.n_embd, seq=cfg.seq_len,
                          micro_batch=16, bytes_per_element=FP32)
    ring, grads = theory.collectives
    assert report["comm"]["isend"] == {"calls": ring.count, "bytes": ring.bytes_sent}
    assert sum(report["context_parallel"]["kv_bytes_sent_per_step"].values()) == ring.bytes_sent  # the ring's log
    assert report["comm"]["all_reduce"] == {"calls": 1, "bytes": ring_bytes_sent("all_reduce", params * FP32, 4)}


def test_sharding_round_trips_and_refuses_a_length_it_cannot_split():
    import torch

    x = torch.arange(2 * T).reshape(2, T)
    for zigzag in (False, True):
        sharding = Sharding(T, N, zigzag)
        shards = [sharding.shard(x, r) for r in range(N)]
        assert torch.equal(sharding.unshard(shards), x)
        assert sorted(torch.cat([sharding.positions(r) for r in range(N)]).tolist()) == list(range(T))
    assert Sharding(T, N).positions(0).tolist() == [0, 1, 2, 21, 22, 23]        # chunks 0 and 2n−1 of 8
    with pytest.raises(ValueError, match="sequence length 20 is not divisible by 8 .2 × 4 zig-zag chunks."):
        Sharding(20, N)


@pytest.mark.parametrize("flags, words", [
    (dict(nproc=4, cp=2), "give --cp equal to --nproc"),
    (dict(nproc=4, cp=4, tp=2), "no --dp/--tp/--pp"),
    (dict(nproc=3, cp=3), "--cp 3: the zig-zag split needs 2 × cp chunks of the 32 positions; use --cp 1, 2, 4, 8, 16"),
])
def test_bad_layouts_name_the_fix(flags, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        get_strategy("cp").layout(TrainConfig(strategy="cp", **flags))
