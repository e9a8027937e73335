"""2D parallelism: FSDP over "dp" × tensor parallelism over "tp" on a 2 × 2 grid — ours (`fsdp-tp`) and PyTorch's
(`torch-fsdp-tp`: fully_shard on mesh["dp"] over parallelize_module on mesh["tp"]) against `single`, each
dimension's traffic against `theory.traffic`, and our composition on a model the course never saw against one
process. One 4-rank launch runs everything and publishes the numbers; the tests assert.
"""
from pathlib import Path

import pytest

from partrain_edu.config import TrainConfig
from partrain_edu.launcher import torchrun
from partrain_edu.strategies import get_strategy
from partrain_edu.theory.traffic import ring_bytes_sent, step_traffic
from partrain_edu.train import launch

STEPS, M, GLOBAL_BATCH, DP, TP = 3, 2, 16, 2, 2
FP32 = 4
TESTS = Path(__file__).parent

RANK_SCRIPT = r'''
import sys
sys.path.insert(0, sys.argv[2])                     # tests/: the unseen models
import torch
import torch.distributed as dist
import torch.nn.functional as F
import unseen_tp_pp_models as um
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.config import TrainConfig
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.fsdp import FullyShardedDataParallel
from partrain_edu.parallel.hybrid import traffic_by_dimension
from partrain_edu.parallel.tensor import TensorParallelRegion, parallelize, vocab_parallel_cross_entropy
from partrain_edu.strategies import get_strategy
from partrain_edu.train import run

steps, m = 3, int(sys.argv[1])
ctx = runtime.init()
out = {"runs": {}}
for name in ("fsdp-tp", "torch-fsdp-tp"):
    cfg = TrainConfig(strategy=name, nproc=4, dp=2, tp=2, steps=steps, microbatches=m)
    report = run(ctx, cfg)
    strategy = get_strategy(name)(ctx, cfg)          # one more step, traced: the bytes along each dimension
    x, y = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=0).global_batch(0, cfg.global_batch)
    with CommTracer() as tracer:
        strategy.train_step(x, y)
    mine = {"traffic": traffic_by_dimension(tracer.records, strategy.ctx.topology), "coords": strategy.ctx.coords}
    if name == "fsdp-tp":                             # the tp slice FSDP shards: its units' padded sizes
        mine["slice_params"] = sum(f.padded for f in strategy.model.flat_shards())
        mine["full_params"] = sum(p.numel() for p in TinyGPT(cfg.model).parameters())
    everyone = [None] * 4
    dist.all_gather_object(everyone, mine)
    out["runs"][name] = {"losses": report["losses"], "state_bytes": report["state_bytes"], "ranks": everyone}

# A model the course never saw: tensor parallel by its own plan over tp, our FSDP over dp, against one process
# on the whole batch. Each piece's gradient is copied into the piece, so `state_dict()` gathers the gradients.
topo = ctx.with_layout(dp=2, tp=2).topology
d, t = topo.coords["dp"], topo.coords["tp"]
idx = torch.randint(0, um.AttentionLM.VOCAB, (4, um.AttentionLM.SEQ), generator=torch.Generator().manual_seed(3))
targets = torch.randint(0, um.AttentionLM.VOCAB, idx.shape, generator=torch.Generator().manual_seed(4))
full = um.AttentionLM()
reference = F.cross_entropy(full(idx).flatten(0, 1), targets.flatten())
reference.backward()
region = TensorParallelRegion(topo.group("tp"))
lm = parallelize(um.AttentionLM(), um.LM_PLAN, region, inputs=um.LM_INPUTS)
split = {k: getattr(p, "tp_split_dim", None) for k, p in lm.named_parameters()}
model = FullyShardedDataParallel(lm, topo.group("dp"), units=list(lm.layers))
half = slice(d * 2, d * 2 + 2)                       # this dp replica's half of the batch
loss = vocab_parallel_cross_entropy(model(idx[half]), targets[half], region)
loss.backward()
with torch.no_grad():
    for p in model.parameters():
        p.copy_(p.grad)
grads_here = model.state_dict()                      # gathered over dp, still this rank's tp slice


def piece(name, tensor):
    return tensor if split[name] is None else tensor.chunk(2, split[name])[t]


grads = dict(full.named_parameters())
gaps = [float((grads_here[k] - piece(k, grads[k].grad)).abs().max()
              / piece(k, grads[k].grad).abs().max().clamp_min(1e-12)) for k in split]
mean_loss = torch.tensor([loss.item()])
dist.all_reduce(mean_loss, group=topo.group("dp"))
lm_out = {"loss": abs(mean_loss.item() / 2 - reference.item()) / reference.item(), "grads": max(gaps),
          "names": sorted(split) == sorted(k for k, _ in full.named_parameters())}
everyone = [None] * 4
dist.all_gather_object(everyone, lm_out)
out["unseen"] = everyone
runtime.publish("fsdp_tp", out)
runtime.shutdown()
'''


@pytest.fixture(scope="module")
def two_d():
    return torchrun(RANK_SCRIPT, nproc=4, args=(str(M), str(TESTS)), timeout=300, echo=None).published["fsdp_tp"]


@pytest.fixture(scope="module")
def single():
    return launch(TrainConfig(strategy="single", steps=STEPS, microbatches=M))["losses"]


def test_bad_layouts_name_the_fix():
    with pytest.raises(ValueError, match=r"--dp 2 × --tp 2 = 4 ranks, but there are 8"):
        get_strategy("fsdp-tp").layout(TrainConfig(strategy="fsdp-tp", nproc=8, dp=2, tp=2))
    with pytest.raises(ValueError, match="--tp 3 does not divide"):
        get_strategy("torch-fsdp-tp").layout(TrainConfig(strategy="torch-fsdp-tp", nproc=6, dp=2, tp=3))
    with pytest.raises(ValueError, match="drop --pp"):
        get_strategy("fsdp-tp").layout(TrainConfig(strategy="fsdp-tp", nproc=4, dp=2, tp=1, pp=2))


@pytest.mark.parametrize("name", ["fsdp-tp", "torch-fsdp-tp"])
def test_2x2_reproduces_single_in_fp32(two_d, single, name):
    losses = two_d["runs"][name]["losses"]
    assert len(losses) == STEPS, (losses, single)
    assert max(abs(a - b) / b for a, b in zip(losses, single, strict=True)) < 1e-5, (losses, single)


def test_each_rank_holds_a_quarter_of_the_split_matrices(two_d):
    ours, theirs = (two_d["runs"][n]["state_bytes"] for n in ("fsdp-tp", "torch-fsdp-tp"))
    r = two_d["runs"]["fsdp-tp"]["ranks"][0]
    # tensor parallelism splits the matrices and keeps norms and row-parallel biases whole on both tp ranks
    full = r["full_params"]
    assert ours["params"] == r["slice_params"] // DP * FP32 and full / TP < r["slice_params"] < full / TP * 1.05
    assert ours["optimizer"] >= 2 * ours["params"] and theirs["params"] <= ours["params"] * 1.05


def test_each_dimension_sends_what_the_traffic_model_says(two_d):
    b = GLOBAL_BATCH // (DP * M)                     # sequences per micro-batch on one replica
    T, H, L = 32, 64, 4
    activation, per_token = b * T * H * FP32, b * T * FP32
    tp_model = step_traffic("tp", tp=TP, layers=L, hidden=H, seq=T, micro_batch=b, microbatches=M,
                            bytes_per_element=FP32).per_rank_bytes_sent
    # beyond the layers' 4 all-reduces: the embedding's g, the head's f and the loss's 3, per micro-batch
    extra = M * (2 * ring_bytes_sent("all_reduce", activation, TP) + 3 * ring_bytes_sent("all_reduce", per_token, TP))
    for name in ("fsdp-tp", "torch-fsdp-tp"):
        for r in two_d["runs"][name]["ranks"]:
            traffic = r["traffic"]
            assert traffic["tp"] == {"calls": M * (4 * L + 5), "bytes": tp_model + extra}, (name, traffic)
            assert traffic["world"]["bytes"] == 0 and traffic["pp"]["bytes"] == 0
    ours = two_d["runs"]["fsdp-tp"]["ranks"]
    dp_model = step_traffic("zero3", ours[0]["slice_params"], dp=DP, microbatches=M,
                            bytes_per_element=FP32).per_rank_bytes_sent
    units = 1 + L
    for r in ours:   # per unit and micro-batch: 2 all-gathers and a reduce-scatter of the tp slice
        assert r["traffic"]["dp"] == {"calls": 3 * M * units, "bytes": dp_model}
    # FSDP2 keeps the root gathered from forward into backward and pads per parameter: a little under ours
    for r in two_d["runs"]["torch-fsdp-tp"]["ranks"]:
        assert 0.9 * dp_model <= r["traffic"]["dp"]["bytes"] <= dp_model * 1.01, r["traffic"]["dp"]


def test_our_composition_trains_an_unseen_model_as_one_process(two_d):
    for r in two_d["unseen"]:
        assert r["names"] and r["loss"] < 1e-5 and r["grads"] < 1e-5, r
