"""Rank side of tests/test_loop_semantics.py: gradient accumulation over K = 4 micro-batches (DDP and FSDP in
no_sync, ZeroOptimizer's own way), torch.utils.checkpoint around FSDP units and tensor-parallel blocks, and the
parameters FSDP leaves visible — each against one process on the whole batch, beside PyTorch's DDP no_sync and
FSDP2's set_requires_gradient_sync. Run: torchrun --nproc-per-node N tests/ranks/loop_accumulation.py."""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as TorchDDP
from torch.utils.checkpoint import checkpoint

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.parallel import DistributedDataParallel, FullyShardedDataParallel, ZeroOptimizer, parallelize
from partrain_edu.parallel.clipping import plain
from partrain_edu.parallel.tensor import full_slice

K, STEPS, ROWS, LR = 4, 2, 16, 1e-2
ctx = runtime.init()
n, r = ctx.world_size, ctx.rank


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, h):                                   # (B, 16) → (B, 16)
        return h + self.fc2(torch.tanh(self.fc1(h)))


class Stack(nn.Module):
    """The root owns inp and out; each block is an FSDP unit (the children of a ModuleList)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.out = nn.Linear(8, 16), nn.Linear(16, 4)
        self.blocks = nn.ModuleList(Block() for _ in range(3))

    def forward(self, x, ckpt=False):
        h = torch.tanh(self.inp(x))
        for block in self.blocks:
            h = checkpoint(block, h, use_reentrant=ckpt == "reentrant") if ckpt else block(h)
        return self.out(h)


def micro(step, rank=r, world=n):
    """This rank's K micro-batches of step `step` (rank r of n holds rows [r·16/n, (r+1)·16/n))."""
    g = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(ROWS, 8, generator=g), torch.randn(ROWS, 4, generator=g)
    b = ROWS // world
    return list(zip(x[rank * b:(rank + 1) * b].chunk(K), y[rank * b:(rank + 1) * b].chunk(K), strict=True))


def one_process():
    """One process over the K global micro-batches (micro-batch j: every rank's j-th), AdamW after each step."""
    model = Stack()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        per_rank = [micro(step, q) for q in range(n)]
        for j in range(K):
            x, y = (torch.cat([per_rank[q][j][i] for q in range(n)]) for i in (0, 1))
            (F.mse_loss(model(x), y) / K).backward()
        opt.step()
    return dict(model.named_parameters())


def accumulate(model, opt, quiet, ops):
    """STEPS steps of K micro-batches, all but the last inside `quiet()`; the calls of `ops` in each step."""
    calls = []
    for step in range(STEPS):
        opt.zero_grad()
        with CommTracer() as tracer:
            for j, (x, y) in enumerate(micro(step)):
                with quiet() if j < K - 1 else contextlib.nullcontext():
                    (F.mse_loss(model(x), y) / K).backward()
            opt.step()
        summary = tracer.summary()
        calls.append({op: summary.get(op, {}).get("calls", 0) for op in ops})
    return calls


def gap(pairs):
    return max(float((plain(a).detach() - b.detach()).abs().max()) for a, b in pairs)


ref = one_process()
results = {}
none = contextlib.nullcontext
for label, sync in (("no_sync", True), ("every micro-batch", False)):
    ddp = DistributedDataParallel(Stack())
    opt = torch.optim.AdamW(ddp.parameters(), lr=LR)
    calls = accumulate(ddp, opt, ddp.no_sync if sync else none, ["all_reduce"])
    results[f"DDP {label}"] = {"calls": calls, "expected": len(ddp.buckets) * (1 if sync else K),
                               "params": gap((p, ref[k]) for k, p in ddp.module.named_parameters())}
    fsdp = FullyShardedDataParallel(Stack())
    opt = torch.optim.AdamW(fsdp.parameters(), lr=LR)
    calls = accumulate(fsdp, opt, fsdp.no_sync if sync else none, ["reduce_scatter_single"])
    shards = sum(1 for s in fsdp.shards() if s.trainable)
    results[f"FSDP {label}"] = {"calls": calls, "expected": shards * (1 if sync else K),
                                "params": gap((v, ref[k]) for k, v in fsdp.state_dict().items())}
for stage, quiet in ((1, None), (2, "no_sync"), (2, None)):
    model = Stack()
    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=stage, lr=LR)
    calls = accumulate(model, opt, opt.no_sync if quiet else none, ["reduce_scatter_single"])
    once = stage == 1 or quiet
    results[f"ZeroOptimizer stage {stage}{' no_sync' if quiet else ''}"] = {
        "calls": calls, "expected": len(opt.flats) * (1 if once else K),
        "params": gap((p, ref[k]) for k, p in model.named_parameters())}

theirs = TorchDDP(Stack())
accumulate(theirs, torch.optim.AdamW(theirs.parameters(), lr=LR), theirs.no_sync, [])
results["PyTorch DDP no_sync"] = {"params": gap((p, ref[k]) for k, p in theirs.module.named_parameters())}
fsdp2 = Stack()
mesh = init_device_mesh("cpu", (n,))
for block in fsdp2.blocks:
    fully_shard(block, mesh=mesh)
fully_shard(fsdp2, mesh=mesh)


@contextlib.contextmanager
def fsdp2_quiet():
    fsdp2.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        fsdp2.set_requires_gradient_sync(True)


accumulate(fsdp2, torch.optim.AdamW(fsdp2.parameters(), lr=LR), fsdp2_quiet, [])
results["PyTorch FSDP2 without gradient sync"] = {
    "params": gap((p.full_tensor(), ref[k]) for k, p in fsdp2.named_parameters())}

# -- torch.utils.checkpoint around each FSDP unit: same gradients; each unit gathered again, then freed -------
x_all = torch.cat([torch.cat([xb for xb, _ in micro(0, q)]) for q in range(n)])
y_all = torch.cat([torch.cat([yb for _, yb in micro(0, q)]) for q in range(n)])
full = Stack()
F.mse_loss(full(x_all), y_all).backward()
want = {k: p.grad for k, p in full.named_parameters()}
mine_x, mine_y = (torch.cat([t[i] for t in micro(0)]) for i in (0, 1))


def watch(fsdp, unit, phase, seen):
    """Record (phase, "in"/"out", unit, bytes gathered then) each time `unit` starts and ends a forward."""
    unit.module.register_forward_pre_hook(
        lambda m, a: seen.append((phase[0], "in", unit.index, fsdp.gathered_bytes_now)))
    unit.module.register_forward_hook(
        lambda m, a, o: seen.append((phase[0], "out", unit.index, fsdp.gathered_bytes_now)))


for ckpt in (True, "reentrant", False):
    fsdp = FullyShardedDataParallel(Stack())
    phase, seen = ["forward"], []
    for unit in fsdp.units[1:]:
        watch(fsdp, unit, phase, seen)
    loss = F.mse_loss(fsdp(mine_x, ckpt=ckpt), mine_y)
    phase[0] = "backward"
    with CommTracer() as tracer:
        loss.backward()
    after = fsdp.gathered_bytes_now
    with torch.no_grad():
        for p in fsdp.parameters():
            if p.grad is not None:
                p.copy_(plain(p.grad))
    grads = fsdp.state_dict()
    results[f"FSDP checkpoint={ckpt}"] = {
        "grads": max(float((grads[k] - g).abs().max() / g.abs().max()) for k, g in want.items()),
        "backward_gathers": tracer.summary().get("all_gather_single", {}).get("calls", 0),
        "units": len([u for u in fsdp.units if u.shards]), "after": after, "seen": seen,
        "unit_bytes": {u.index: u.gathered_bytes for u in fsdp.units}}

# -- torch.utils.checkpoint around tensor-parallel blocks: the same gradients as one process ----------------
for ckpt in (True, "reentrant", False):
    tp = parallelize(Stack(), {"blocks.*.fc1": "colwise", "blocks.*.fc2": "rowwise"}, dist.group.WORLD)
    F.mse_loss(tp(x_all, ckpt=ckpt), y_all).backward()
    results[f"TP checkpoint={ckpt}"] = {"grads": max(
        float((plain(p.grad) - full_slice(want[k], p, dist.group.WORLD)).abs().max() / want[k].abs().max())
        for k, p in tp.named_parameters())}

# -- every parameter visible under FSDP: the wrapper's and the module's own list, the same pieces ------------
fsdp = FullyShardedDataParallel(Stack())
names = [k for k, _ in Stack().named_parameters()]
fsdp.state_dict()                                           # registers full views for a while: put back after
results["visible"] = {
    "module": [k for k, _ in fsdp.module.named_parameters()] == names,
    "wrapper": [k for k, _ in fsdp.named_parameters()] == names,
    "same pieces": all(a is b for (_, a), (_, b) in zip(fsdp.module.named_parameters(), fsdp.named_parameters(),
                                                         strict=True)),
    "one dimension": all(p.dim() == 1 for p in fsdp.module.parameters())}

everyone = [None] * n
dist.all_gather_object(everyone, results)
if r == 0:
    runtime.publish("results", everyone)
runtime.shutdown()
