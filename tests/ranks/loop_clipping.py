"""Rank side of tests/test_loop_semantics_clipping.py: issue 27's clipping table, rerun. Sequential(Linear(8, 8),
Tanh(), Linear(8, 4)) with MSE, seed 0; batch s = randn(8, 8), randn(8, 4) from Generator seed 1 + s (batch 0's
true total norm: 0.6016), rank r of n taking rows [8r/n, 8(r+1)/n) (tensor parallelism: all of them). Per setup:
the norm each rank clips by, what torch.nn.utils.clip_grad_norm_ does, and the parameters after three clipped
AdamW steps (max_norm 0.05) against one process. Run: torchrun --nproc-per-node N tests/ranks/loop_clipping.py."""
import math

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.parallel import DistributedDataParallel, FullyShardedDataParallel, ZeroOptimizer, parallelize
from partrain_edu.parallel.clipping import clip_grad_norm_tp, is_placeholder, plain
from partrain_edu.parallel.tensor import full_slice

MAX_NORM, STEPS, LR = 0.05, 3, 1e-2
ctx = runtime.init()
n, r = ctx.world_size, ctx.rank


def build():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4))


def batch(step, sliced=True):
    g = torch.Generator().manual_seed(1 + step)
    x, y = torch.randn(8, 8, generator=g), torch.randn(8, 4, generator=g)
    b = 8 // n
    return (x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]) if sliced else (x, y)


def everyone(value):
    out = [None] * n
    dist.all_gather_object(out, value)
    return out


def local_norm(params):
    """What torch.nn.utils.clip_grad_norm_ would have clipped by on this rank (a dropped gradient: nothing)."""
    grads = [plain(p.grad) for p in params if p.grad is not None and not is_placeholder(p.grad)]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0


def torch_clip(params):
    """torch.nn.utils.clip_grad_norm_ on these parameters: the norm it returned, or the error it raised."""
    try:
        return float(torch.nn.utils.clip_grad_norm_(list(params), 1e9))
    except RuntimeError as e:
        return str(e)


# One process, the whole batch: the norms and the parameters every setup must reproduce.
ref = build()
ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR)
ref_norms = []
for step in range(STEPS):
    ref_opt.zero_grad()
    F.mse_loss(ref(batch(step, sliced=False)[0]), batch(step, sliced=False)[1]).backward()
    ref_norms.append(float(torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM)))
    ref_opt.step()
ref_params = dict(ref.named_parameters())


def run(model, opt, clip, sliced=True, params=None, state=None):
    """Three clipped steps; the norms clip returned, torch's clip and the would-be local norm at step 0."""
    out = {"norms": [], "torch": None, "local": None, "all_reduces": None}
    for step in range(STEPS):
        x, y = batch(step, sliced)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        if step == 0 and params is not None:
            out["local"], out["torch"] = local_norm(params()), torch_clip(params())
        with CommTracer() as tracer:
            out["norms"].append(float(clip(MAX_NORM)))
        if step == 0:
            out["all_reduces"] = tracer.summary().get("all_reduce", {}).get("calls", 0)
        opt.step()
    out["params"] = max(float((a.detach() - b.detach()).abs().max()) for a, b in state())
    return out


results = {}
for stage in (1, 2):
    model = build()
    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=stage, lr=LR)
    results[f"ZeroOptimizer stage {stage}"] = run(
        model, opt, opt.clip_grad_norm_, params=model.parameters,
        state=lambda m=model: [(p, ref_params[k]) for k, p in m.named_parameters()])

fsdp = FullyShardedDataParallel(build(), units=lambda name, m: isinstance(m, nn.Linear))
opt = torch.optim.AdamW(fsdp.parameters(), lr=LR)
results["FullyShardedDataParallel"] = run(
    fsdp, opt, fsdp.clip_grad_norm_, params=fsdp.parameters,
    state=lambda: [(v, ref_params[k]) for k, v in fsdp.state_dict().items()])

tp = parallelize(build(), {"0": "colwise", "2": "rowwise"}, dist.group.WORLD)
opt = torch.optim.AdamW(tp.parameters(), lr=LR)
results["tensor parallel"] = run(
    tp, opt, lambda m: clip_grad_norm_tp(tp, m, dist.group.WORLD), sliced=False, params=tp.parameters,
    state=lambda: [(p, full_slice(ref_params[k], p, dist.group.WORLD)) for k, p in tp.named_parameters()])

ddp = DistributedDataParallel(build())
opt = torch.optim.AdamW(ddp.parameters(), lr=LR)
results["DistributedDataParallel + torch's clip"] = run(
    ddp, opt, lambda m: torch.nn.utils.clip_grad_norm_(ddp.parameters(), m), params=ddp.parameters,
    state=lambda: [(p, ref_params[k]) for k, p in ddp.module.named_parameters()])

theirs = TorchDDP(build())
zro = ZeroRedundancyOptimizer(theirs.parameters(), optimizer_class=torch.optim.AdamW, lr=LR)
results["PyTorch DDP + ZeroRedundancyOptimizer"] = run(
    theirs, zro, lambda m: torch.nn.utils.clip_grad_norm_(theirs.parameters(), m), params=theirs.parameters,
    state=lambda: [(p, ref_params[k]) for k, p in theirs.module.named_parameters()])

fsdp2 = build()
mesh = init_device_mesh("cpu", (n,))
for layer in (fsdp2[0], fsdp2[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(fsdp2, mesh=mesh)


def fsdp2_clip(max_norm):                      # torchtitan's way: the DTensor norm made whole, then clip
    grads = [p.grad for p in fsdp2.parameters() if p.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    total = total.full_tensor() if hasattr(total, "full_tensor") else total
    torch.nn.utils.clip_grads_with_norm_(fsdp2.parameters(), max_norm, total)
    return total


opt = torch.optim.AdamW(fsdp2.parameters(), lr=LR)
results["PyTorch FSDP2 fully_shard"] = run(
    fsdp2, opt, fsdp2_clip,
    state=lambda: [(p.full_tensor(), ref_params[k]) for k, p in fsdp2.named_parameters()])

# Other norms: ∞ and 1, one step, against one process.
other = {}
for norm_type in (math.inf, 1.0):
    one = build()
    F.mse_loss(one(batch(0, sliced=False)[0]), batch(0, sliced=False)[1]).backward()
    want = float(torch.nn.utils.clip_grad_norm_(one.parameters(), MAX_NORM, norm_type))
    model = build()
    zopt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=2, lr=LR)
    F.mse_loss(model(batch(0)[0]), batch(0)[1]).backward()
    f = FullyShardedDataParallel(build(), units=lambda name, m: isinstance(m, nn.Linear))
    F.mse_loss(f(batch(0)[0]), batch(0)[1]).backward()
    t = parallelize(build(), {"0": "colwise", "2": "rowwise"}, dist.group.WORLD)
    F.mse_loss(t(batch(0, sliced=False)[0]), batch(0, sliced=False)[1]).backward()
    other[str(norm_type)] = {"want": want, "zero2": float(zopt.clip_grad_norm_(MAX_NORM, norm_type)),
                             "fsdp": float(f.clip_grad_norm_(MAX_NORM, norm_type)),
                             "tp": float(clip_grad_norm_tp(t, MAX_NORM, dist.group.WORLD, norm_type))}

table = {case: everyone(res) for case, res in results.items()}
if r == 0:
    runtime.publish("results", {"ref_norms": ref_norms, "table": table, "other": other})
runtime.shutdown()
