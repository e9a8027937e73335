"""The naive ZeRO-1/2 and ZeRO-3 (parallel/zero_naive.py, parallel/fsdp_naive.py) against one process and against
the full wrappers (ZeroOptimizer, FullyShardedDataParallel): the same losses and parameters on TinyGPT and on
models the library has never seen (tests/unseen_models.py), the bytes of the ZeRO formulas, the gathered buffer
freed after forward and after backward. One launch of 2 ranks; refusals and the 80-line limit run here."""
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import unseen_models as um
from partrain_edu import runtime
from partrain_edu.launcher import torchrun
from partrain_edu.models import TinyGPT, count_params
from partrain_edu.parallel import fsdp_naive, zero_naive
from partrain_edu.parallel.fsdp_naive import NaiveFSDP
from partrain_edu.parallel.zero_naive import NaiveZero
from partrain_edu.theory.traffic import step_traffic

N = 2
LOSS = 1e-5                  # relative, float32: averaged slices round differently from one whole batch
# largest |difference| of a weight: Adam divides by √v, so float32 rounding in a gradient that is ~0 (a key's
# bias: softmax ignores it) moves that weight by up to ~1e-5, as under DDP (tests/test_zero.py)
PARAMS = 1e-4
MODELS = ("tinygpt", "uneven", "tied", "batchnorm")
VARIANTS = ("naive zero1", "naive zero2", "zero1", "zero2", "naive fsdp", "fsdp")

SCRIPT = r"""
import sys, time, weakref
import torch, torch.distributed as dist
sys.path.insert(0, sys.argv[1])
import unseen_models as um
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.fsdp import FullyShardedDataParallel
from partrain_edu.parallel.fsdp_naive import NaiveFSDP
from partrain_edu.parallel.zero import ZeroOptimizer
from partrain_edu.parallel.zero_naive import NaiveZero

ctx = runtime.init()
n, r = ctx.world_size, ctx.rank
STEPS, LR = 3, 1e-2
tokens = SyntheticTokens()

def build(name):
    return TinyGPT() if name == "tinygpt" else um.build(name)

def batch(name, step, part):
    x, y = tokens.global_batch(step, 8) if name == "tinygpt" else um.batch(name, step)
    return um.rank_slice(name, x, y, *part)

def loss(model, name, x, y, step):
    return TinyGPT.loss(model(x), y) if name == "tinygpt" else um.loss(model, name, x, y, step)

def wrap(variant, model):
    # (what forward runs, the optimizer); AdamW with one param group everywhere: the naive versions have one
    if variant == "single":
        return model, torch.optim.AdamW(model.parameters(), lr=LR)
    if variant.startswith("naive zero"):
        return model, NaiveZero(model, torch.optim.AdamW, None, stage=int(variant[-1]), lr=LR)
    if variant.startswith("zero"):
        return model, ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=int(variant[-1]), lr=LR)
    fsdp = NaiveFSDP(model, None) if variant == "naive fsdp" else FullyShardedDataParallel(model)
    return fsdp, torch.optim.AdamW(fsdp.parameters(), lr=LR)

def full_params(variant, model, names):
    if variant == "naive fsdp":
        return dict(zip(names, model.all_gather()[:sum(model.sizes)].split(model.sizes)))
    if variant == "fsdp":
        return model.state_dict()
    return dict(model.named_parameters())

def train(name, variant, microbatches=1):
    model = build(name)
    names = [k for k, _ in model.named_parameters()]
    shapes = {k: p.shape for k, p in model.named_parameters()}
    wrapped, opt = wrap(variant, model)
    part = (0, 1) if variant == "single" else (r, n)
    losses = []
    for step in range(STEPS):
        x, y = batch(name, step, part)
        opt.zero_grad()
        total = 0.0
        for xb, yb in zip(x.chunk(microbatches), y.chunk(microbatches)):
            l = loss(wrapped, name, xb, yb, step) / microbatches
            l.backward()
            total += l.detach()
        opt.step()
        if part[1] > 1:                          # the ranks' slices are equal: their mean is the batch's loss
            dist.all_reduce(total)
            total /= n
        losses.append(float(total))
    params = {k: v.detach().reshape(shapes[k]).clone() for k, v in full_params(variant, wrapped, names).items()
              if k in shapes}
    return losses, params

def gap(a, b):
    return float((a - b).abs().max())

def compare(name, variants, microbatches=1):
    ref_losses, ref = train(name, "single", microbatches)
    out = {}
    for variant in variants:
        losses, params = train(name, variant, microbatches)
        out[variant] = {"losses": max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses)),
                        "params": max(gap(params[k], v) for k, v in ref.items()),
                        "names": sorted(params) == sorted(ref), "params_raw": params}
    return out

def released(refs):
    # which buffers are still alive; Gloo's worker thread may hold a finished collective's output a moment longer
    for _ in range(200):
        if all(ref() is None for ref in refs):
            break
        time.sleep(0.005)
    return [ref() is not None for ref in refs]

def one_step_bytes(variant):
    # what one step (forward, backward, optimizer step) sends, on TinyGPT; the buffers one naive FSDP step gathers
    model = TinyGPT()
    wrapped, opt = wrap(variant, model)
    buffers, alive = [], {}
    if variant == "naive fsdp":
        gather = wrapped.all_gather
        wrapped.all_gather = lambda: buffers.append(gather()) or buffers[-1]
    x, y = batch("tinygpt", 0, (r, n))
    with CommTracer() as tracer:
        out = wrapped(x)
        if variant == "naive fsdp":
            refs = [weakref.ref(b) for b in buffers]
            buffers.clear()
            alive["after forward"] = released(refs)
            alive["weights after forward"] = model.head.weight is None and model.blocks[0].mlp.fc.weight is None
        TinyGPT.loss(out, y).backward()
        if variant == "naive fsdp":
            refs += [weakref.ref(b) for b in buffers]
            buffers.clear()
            alive["after backward"] = released(refs)
        opt.step()
    sent = {op: v["bytes"] for op, v in tracer.summary().items()}
    psi = sum(p.numel() for p in TinyGPT().parameters())
    return {"sent": sent, "padded": -(-psi // n) * n, "alive": alive}

results = {}
for name in ("tinygpt", "uneven", "tied", "batchnorm"):
    cases = compare(name, ("naive zero1", "naive zero2", "zero1", "zero2", "naive fsdp", "fsdp"))
    for variant, res in cases.items():
        res["vs full"] = None
        full = cases.get(variant.removeprefix("naive "))
        if variant.startswith("naive") and full is not None:
            res["vs full"] = max(gap(res["params_raw"][k], v) for k, v in full["params_raw"].items())
    for variant, res in cases.items():
        del res["params_raw"]
        results[f"{name} {variant}"] = res
for variant, res in compare("uneven", ("naive zero1", "naive zero2", "naive fsdp"), microbatches=2).items():
    del res["params_raw"]
    results[f"uneven m2 {variant}"] = res
for variant in ("naive zero1", "naive zero2", "naive fsdp", "zero1", "fsdp"):
    results[f"traffic {variant}"] = one_step_bytes(variant)
runtime.publish("results", results)
"""


@pytest.fixture(scope="module")
def results():
    tests = str(Path(__file__).parent)
    return torchrun(SCRIPT, nproc=N, args=[tests], timeout=300, echo=None).published["results"]


def test_naive_versions_match_one_process_and_the_full_wrappers(results):
    for name in MODELS:
        for variant in VARIANTS:
            res = results[f"{name} {variant}"]
            assert res["names"] and res["losses"] < LOSS and res["params"] < PARAMS, (name, variant, res)
            if variant.startswith("naive"):
                assert res["vs full"] < 1e-6, (name, variant, res)      # the same arithmetic: 0 on CPU
    for variant in ("naive zero1", "naive zero2", "naive fsdp"):       # 2 micro-batches, gradients accumulated
        res = results[f"uneven m2 {variant}"]
        assert res["names"] and res["losses"] < LOSS and res["params"] < PARAMS, (variant, res)


def test_bytes_sent_match_the_zero_formulas(results):
    psi = count_params(TinyGPT())
    for variant, halves in (("naive zero1", 2), ("naive zero2", 2), ("naive fsdp", 3)):
        res = results[f"traffic {variant}"]
        assert res["padded"] == psi                                      # TinyGPT needs no padding on 2 ranks
        one_half = (N - 1) * psi * 4 // N                                # (n−1)/n·Ψ·4 bytes
        assert sum(res["sent"].values()) == halves * one_half, (variant, res)
        assert res["sent"]["reduce_scatter_single"] == one_half
        stage = "zero3" if "fsdp" in variant else variant.split()[1]
        assert sum(res["sent"].values()) == step_traffic(stage, psi, dp=N, bytes_per_element=4).per_rank_bytes_sent
    # the same bytes as the full wrappers, in fewer calls (one flat buffer, not one per unit)
    assert results["traffic naive zero1"]["sent"] == results["traffic zero1"]["sent"]
    assert results["traffic naive fsdp"]["sent"] == results["traffic fsdp"]["sent"]


def test_naive_fsdp_frees_the_gathered_buffer_after_forward_and_after_backward(results):
    alive = results["traffic naive fsdp"]["alive"]
    assert alive["after forward"] == [False] and alive["weights after forward"]
    assert alive["after backward"] == [False, False]                    # gathered again in backward, then freed


def test_the_naive_files_are_at_most_80_lines():
    for module in (zero_naive, fsdp_naive):
        assert len(Path(module.__file__).read_text().splitlines()) <= 80, module.__name__


@pytest.fixture
def world_of_one():
    runtime.init()
    yield
    runtime.shutdown()


def test_what_the_naive_versions_refuse(world_of_one):
    for build in (lambda: um.build("mixed"), lambda: um.build("frozen")):
        with pytest.raises(ValueError, match="FullyShardedDataParallel"):
            NaiveFSDP(build(), None)
    with pytest.raises(ValueError, match="ZeroOptimizer, which keeps one buffer per dtype"):
        NaiveZero(um.build("mixed"), torch.optim.AdamW, None)
    with pytest.raises(ValueError, match="fsdp_naive.py"):
        NaiveZero(um.build("uneven"), torch.optim.AdamW, None, stage=3)
    model = um.build("branch")
    zero = NaiveZero(model, torch.optim.AdamW, None)
    um.loss(model, "branch", *um.batch("branch", 1), 1).backward()     # step 1: `rare` is not used
    with pytest.raises(RuntimeError, match="got no gradient"):
        zero.step()


def test_frozen_parameters_are_left_alone_by_naive_zero(world_of_one):
    model = um.build("frozen")
    before = model.frozen.weight.clone()
    zero = NaiveZero(model, torch.optim.AdamW, None, lr=1e-2)
    assert len(zero.shard) == sum(p.numel() for p in model.out.parameters())
    um.loss(model, "frozen", *um.batch("frozen", 0), 0).backward()
    zero.step()
    assert torch.equal(model.frozen.weight, before) and isinstance(model.frozen, nn.Linear)
