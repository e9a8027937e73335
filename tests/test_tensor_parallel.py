"""Tensor parallelism (issue 7): `tp`, `tp-sp` and `torch-tp` against `single` and the full model's gradients,
their traffic against `theory.traffic`, sequence parallelism's activation memory against Korthikanti et al.

One launch of tp = 4 runs every check on its ranks and publishes the numbers; the tests assert.
"""
import json
import subprocess
import sys

import pytest

from partrain_edu.config import TrainConfig
from partrain_edu.launcher import torchrun
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.parallel.tensor import check_plan
from partrain_edu.strategies import get_strategy
from partrain_edu.strategies.tensor import TP_PLAN, check_divisible
from partrain_edu.theory.memory import activation_bytes_per_layer
from partrain_edu.theory.traffic import ring_bytes_sent, step_traffic
from partrain_edu.train import launch

FP32, STEPS = 4, 8
B, T, H, HEADS, LAYERS, GLOBAL_BATCH = 4, 32, 64, 4, 4, 16  # the mechanics use a batch of 4; training uses 16

RANK_SCRIPT = r'''
import sys
from collections import Counter

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import loss_parallel

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.sequence import SequenceParallelRegion, layer_activation_bytes
from partrain_edu.parallel.tensor import TensorParallelRegion, full_slice, vocab_parallel_cross_entropy
from partrain_edu.comm.adapters import FunctionalCollectiveCounter
from partrain_edu.config import TrainConfig
from partrain_edu.strategies.tensor import parallelize_tinygpt
from partrain_edu.strategies.torch_tp import dtensor_parallelize_tinygpt
from partrain_edu.train import run

steps, runs = int(sys.argv[1]), sys.argv[2].split(",")
ctx = runtime.init()
t, me = ctx.world_size, ctx.rank
group = dist.new_group(list(range(t)))
x, y = SyntheticTokens(128, 32, seed=0).global_batch(0, 4)  # (4, 32), the same on every rank
full = TinyGPT()
reference = TinyGPT.loss(full(x), y)
reference.backward()
out = {"reference_loss": reference.item()}


def grad_error(model, region):
    """Largest gap between a shard's gradient and the matching slice of the full model's gradient."""
    errors = []
    for name, p in model.named_parameters():
        expected = full.get_parameter(name).grad
        mine = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        errors.append((mine - (expected if hasattr(p.grad, "full_tensor") else full_slice(expected, p, region)))
                      .abs().max().item())
    return max(errors)


def summary(records):
    return sorted(Counter((r.label, r.op, r.bytes, r.sent) for r in records).items())


def one_layer(model, sequence_parallel):
    h = torch.randn(4, 32, 64, generator=torch.Generator().manual_seed(1))
    h = (h.chunk(t, 1)[me] if sequence_parallel else h).clone().requires_grad_()
    return model.blocks[0](h)


for name, region in [("tp", TensorParallelRegion(group)), ("tp-sp", SequenceParallelRegion(group))]:
    model = parallelize_tinygpt(TinyGPT(), region)
    tracer = CommTracer()
    with tracer:
        with tracer.label("forward"), region.saving():
            loss = vocab_parallel_cross_entropy(model(x), y, region)
        with tracer.label("backward"):
            loss.backward()
        with tracer.label("finish"):
            region.finish_grads(model)
        error = grad_error(model, region)
        with tracer.label("layer forward"), region.saving():
            o = one_layer(model, region.sequence_parallel)
        with tracer.label("layer backward"):
            o.backward(torch.ones_like(o))
    out[name] = {"loss": loss.item(), "grad_error": error, "records": summary(tracer.records),
                 "split_bytes": sum(p.numel() * 4 for p in model.parameters() if hasattr(p, "tp_split_dim")),
                 "whole_bytes": sum(p.numel() * 4 for p in model.parameters() if not hasattr(p, "tp_split_dim"))}

h = torch.randn(4, 32, 64)
out["activations"] = {}
for name, region in [("tp", TensorParallelRegion(group)), ("sp", SequenceParallelRegion(group)),
                     ("sp-no-regather", SequenceParallelRegion(group, regather=False))]:
    block = parallelize_tinygpt(TinyGPT(), region).blocks[0]
    shard = h.chunk(t, 1)[me] if region.sequence_parallel else h
    out["activations"][name] = layer_activation_bytes(block, shard, region).total

model = dtensor_parallelize_tinygpt(TinyGPT(), init_device_mesh("cpu", (t,)))
counter = FunctionalCollectiveCounter()
with counter, loss_parallel():
    loss = TinyGPT.loss(model(x), y)
    loss.backward()
modules = {m: {kind: sum(c.values()) for kind, c in v.items()} for m, v in counter.comm_module_counts.items()}
out["torch-tp"] = {"loss": loss.item(), "grad_error": grad_error(model, None), "records": summary(counter.records),
                   "modules": modules}
counter = FunctionalCollectiveCounter()
with counter:
    o = one_layer(model, False)
    o.backward(torch.ones_like(o))
out["torch-tp"]["layer"] = summary(counter.records)

errors = [None] * t
dist.all_gather_object(errors, {k: out[k]["grad_error"] for k in ("tp", "tp-sp", "torch-tp")})
out["grad_errors"] = errors
out["reports"] = {}
for spec in filter(None, runs):
    strategy, _, microbatches = spec.partition(":")
    cfg = TrainConfig(strategy=strategy, nproc=t, tp=t, steps=steps, microbatches=int(microbatches or 1))
    out["reports"][spec] = run(ctx, cfg)
runtime.publish("results", out)
'''


@pytest.fixture(scope="module")
def single():
    return launch(TrainConfig(strategy="single", steps=STEPS))["losses"]


@pytest.fixture(scope="module", params=[4])
def ranks(request, tmp_path_factory):
    t = request.param
    script = tmp_path_factory.mktemp(f"tp{t}") / "tp_checks.py"
    script.write_text(RANK_SCRIPT)
    runs = "tp,tp-sp,torch-tp" + (",tp:2" if t == 4 else "")
    result = torchrun(str(script), nproc=t, args=(str(STEPS), runs), echo=None, timeout=240)
    return t, result.published["results"]


def full_split_bytes():
    """Parameter bytes of the full TinyGPT that the plan splits, and those it leaves whole on every rank."""
    split = whole = 0
    model = TinyGPT()
    styles = check_plan(model, TP_PLAN, tp=1)
    for name, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            style = styles.get(name)
            is_split = style is not None and not (style == "rowwise" and pname == "bias")  # added after the sum
            split, whole = (split + p.numel() * FP32, whole) if is_split else (split, whole + p.numel() * FP32)
    return split, whole


def test_every_shard_holds_the_slice_of_the_full_gradient(ranks):
    t, res = ranks
    for rank_errors in res["grad_errors"]:
        assert max(rank_errors.values()) < 1e-6, rank_errors  # tp, tp-sp and torch-tp on every rank
    for name in ("tp", "tp-sp", "torch-tp"):
        assert res[name]["loss"] == pytest.approx(res["reference_loss"], rel=1e-6)


def test_training_losses_equal_single(ranks, single):
    t, res = ranks
    for spec, report in res["reports"].items():
        assert report["world_size"] == t
        assert report["losses"] == pytest.approx(single, rel=1e-5, abs=1e-5), spec


def test_one_layer_sends_two_all_reduces_each_way_as_theory_says(ranks):
    t, res = ranks
    bsh = B * T * H * FP32
    theory = step_traffic("tp", layers=1, hidden=H, seq=T, micro_batch=B, tp=t, bytes_per_element=FP32)
    assert [(c.op, c.count, c.bytes_per_call) for c in theory.collectives] == [("all_reduce", 4, bsh)]
    expected = [(("layer backward", "all_reduce", bsh, ring_bytes_sent("all_reduce", bsh, t)), 2),
                (("layer forward", "all_reduce", bsh, ring_bytes_sent("all_reduce", bsh, t)), 2)]
    assert [r for r in map(tuple, res["tp"]["records"]) if r[0][0].startswith("layer")] == expected
    assert sum(n * r[3] for r, n in expected) == theory.per_rank_bytes_sent
    # torch-tp: the same four all-reduces, seen by CommDebugMode, bytes priced under the same model
    assert [(("layer " + r[0], *r[1:]), n) for r, n in res["torch-tp"]["layer"]] == expected
    # sequence parallel: all-gather + reduce-scatter in place of each all-reduce, same bytes; backward also
    # re-gathers the two saved input shards
    sp = {r[:2]: (n, r[3]) for r, n in map(tuple, res["tp-sp"]["records"]) if r[0].startswith("layer")}
    half = ring_bytes_sent("all_gather", bsh, t)
    assert sp == {("layer forward", "all_gather_single"): (2, half),
                  ("layer forward", "reduce_scatter_single"): (2, half),
                  ("layer backward", "all_gather_single"): (4, half),
                  ("layer backward", "reduce_scatter_single"): (2, half)}
    assert 2 * half == ring_bytes_sent("all_reduce", bsh, t)


def test_the_whole_model_adds_embedding_head_and_loss_all_reduces(ranks):
    t, res = ranks
    bsh, bs = B * T * H * FP32, B * T * FP32
    model = [r for r in map(tuple, res["tp"]["records"]) if not r[0][0].startswith("layer")]
    assert model == [(("backward", "all_reduce", bsh, ring_bytes_sent("all_reduce", bsh, t)), 2 * LAYERS + 1),
                     (("forward", "all_reduce", bs, ring_bytes_sent("all_reduce", bs, t)), 3),
                     (("forward", "all_reduce", bsh, ring_bytes_sent("all_reduce", bsh, t)), 2 * LAYERS + 1)]
    assert list(map(tuple, res["torch-tp"]["records"])) == model
    mods = res["torch-tp"]["modules"]
    assert mods["TinyGPT.wte"] == {"forward": 1, "backward": 0}
    assert mods["TinyGPT.head"] == {"forward": 0, "backward": 1}
    for i in range(LAYERS):
        assert mods[f"TinyGPT.blocks.{i}"] == {"forward": 2, "backward": 2}
    # the training report's comm: theory's per-layer all-reduces, plus the embedding, head and loss ones
    layers = step_traffic("tp", layers=LAYERS, hidden=H, seq=T, micro_batch=GLOBAL_BATCH, tp=t, bytes_per_element=FP32)
    big, small = GLOBAL_BATCH * T * H * FP32, GLOBAL_BATCH * T * FP32
    extras = 2 * ring_bytes_sent("all_reduce", big, t) + 3 * ring_bytes_sent("all_reduce", small, t)
    for strategy in ("tp", "torch-tp"):
        assert res["reports"][strategy]["comm"] == {"all_reduce": {"calls": 4 * LAYERS + 2 + 3,
                                                                   "bytes": layers.per_rank_bytes_sent + extras}}


def test_each_rank_holds_one_tp_th_of_the_split_layers(ranks):
    t, res = ranks
    split, whole = full_split_bytes()
    for name in ("tp", "tp-sp"):
        assert res[name]["split_bytes"] * t == split and res[name]["whole_bytes"] == whole
        assert res["reports"][name]["state_bytes"]["params"] == split // t + whole
    # DTensor keeps the embedding's gradient whole (Replicate), ours keeps the shard: torch-tp holds more
    assert res["reports"]["torch-tp"]["state_bytes"]["params"] == split // t + whole
    assert res["reports"]["torch-tp"]["state_bytes"]["grads"] > res["reports"]["tp"]["state_bytes"]["grads"]


def test_sequence_parallel_saves_the_activations_korthikanti_predicts(ranks):
    t, res = ranks
    act, sbh = res["activations"], B * T * H
    masks = 2 * sbh  # Korthikanti's two 1-byte dropout masks per layer: TinyGPT has no dropout
    ln_stats = 2 * 2 * B * T * FP32  # mean and 1/std of two LayerNorms, too small for the paper to count
    lse = B * HEADS * T * FP32  # fused attention keeps a log-sum-exp per query instead of the s×s scores

    def theory(sp, recompute="none"):
        return activation_bytes_per_layer(seq=T, micro_batch=B, hidden=H, heads=HEADS, tp=t, sequence_parallel=sp,
                                          recompute=recompute, element_bytes=FP32)
    # fused attention (SDPA) never stores the s×s scores: the formula with selective recomputation
    assert act["tp"] == theory(False, "selective") - masks + ln_stats + lse // t
    assert act["sp"] == theory(True, "selective") - masks // t + (ln_stats + lse) // t
    saved = theory(False) - theory(True)  # the replicated 10sbh (at 16 bits) shrinks t-fold
    assert act["tp"] - act["sp"] == saved - masks + masks // t + ln_stats - ln_stats // t
    # without re-gathering the matmul inputs in backward, only the LayerNorm inputs shrink: half the saving
    assert act["tp"] - act["sp-no-regather"] == (saved - masks + masks // t) // 2 + ln_stats - ln_stats // t


def test_the_cli_trains_tp_and_reports_the_contract(single):
    done = subprocess.run([sys.executable, "-m", "partrain_edu", "train", "--strategy", "tp", "--nproc", "2",
                           "--steps", "3", "--json"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["strategy"] == "tp" and report["world_size"] == 2
    assert report["losses"] == pytest.approx(single[:3], rel=1e-5, abs=1e-5)
    assert report["comm"]["all_reduce"]["calls"] >= 4 * LAYERS


@pytest.mark.parametrize("cfg, tp, sp, words", [
    (GPTConfig(), 3, False, "tp=3 does not divide the hidden size (64): every rank needs an equal slice; "
                            "use tp=1, 2, 4"),
    (GPTConfig(), 8, False, "tp=8 does not divide the number of attention heads (4)"),
    (GPTConfig(vocab_size=130), 4, False, "tp=4 does not divide the vocabulary (130)"),
    (GPTConfig(seq_len=30), 4, True, "tp=4 does not divide the sequence length (30)"),
])
def test_sizes_that_do_not_divide_name_the_fix(cfg, tp, sp, words):
    with pytest.raises(ValueError, match="^" + words.replace("(", r"\(").replace(")", r"\)")):
        check_divisible(cfg, tp, sequence_parallel=sp)
    check_divisible(cfg, 2, sequence_parallel=sp)  # and a size that divides passes


@pytest.mark.parametrize("strategy", ["tp", "tp-sp", "torch-tp"])
def test_tp_is_tensor_parallel_alone(strategy):
    layout = get_strategy(strategy).layout
    assert layout(TrainConfig(strategy=strategy, nproc=4)) == (1, 4, 1)  # --tp defaults to --nproc
    with pytest.raises(ValueError, match="tensor parallelism alone: give --tp equal to --nproc"):
        layout(TrainConfig(strategy=strategy, nproc=4, tp=2))
    with pytest.raises(ValueError, match="no --dp/--pp"):
        layout(TrainConfig(strategy=strategy, nproc=2, tp=2, dp=2))


def test_the_cli_rejects_a_tp_that_does_not_divide_with_exit_2():
    done = subprocess.run([sys.executable, "-m", "partrain_edu", "train", "--strategy", "tp", "--nproc", "3",
                           "--json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "partrain-edu train: error: --tp 3 does not divide the hidden size (64): every rank needs an equal slice; "
        "use --tp 1, 2, 4"]
