"""Rank side of tests/test_ddp_generic.py: every unseen model wrapped by our DistributedDataParallel and by
PyTorch's, on this rank's slice of each batch, against one process on the whole batch; rank 0 publishes.
Run: torchrun --nproc-per-node N tests/ranks/ddp_generic.py."""
import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as TorchDDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unseen_models as um  # noqa: E402
from partrain_edu import runtime  # noqa: E402
from partrain_edu.parallel.ddp import DistributedDataParallel  # noqa: E402

STEPS = 4
ctx = runtime.init()
n, r = ctx.world_size, ctx.rank


def train(name, model, sliced, unwrap=lambda m: m):
    opt = torch.optim.AdamW(um.param_groups(unwrap(model)), lr=1e-2)
    for step in range(STEPS):
        x, y = um.batch(name, step)
        if sliced:
            x, y = um.rank_slice(name, x, y, r, n)
        opt.zero_grad()
        for xb, yb, last in ((x[: len(x) // 2], y[: len(y) // 2], False), (x[len(x) // 2:], y[len(y) // 2:], True)):
            # two micro-batches, the first without communication (no_sync), as gradient accumulation does
            with (model.no_sync() if not last else torch.enable_grad()):
                (um.loss(model, name, xb, yb, step) / 2).backward()
        opt.step()
    return unwrap(model)


results = {}
for name in um.MODELS:
    unused = name == "branch"
    # one process: the same micro-batches, no wrapper
    ref_model = um.build(name)
    opt = torch.optim.AdamW(um.param_groups(ref_model), lr=1e-2)
    for step in range(STEPS):
        x, y = um.batch(name, step)
        opt.zero_grad()
        for xb, yb in ((x[: len(x) // 2], y[: len(y) // 2]), (x[len(x) // 2:], y[len(y) // 2:])):
            (um.loss(ref_model, name, xb, yb, step) / 2).backward()
        opt.step()
    ours = train(name, DistributedDataParallel(um.build(name), find_unused_parameters=unused), True, lambda m: m.module)
    theirs = train(name, TorchDDP(um.build(name), find_unused_parameters=unused), True, lambda m: m.module)
    ref_params = dict(ref_model.named_parameters())
    results[name] = {
        "single": max(um.rel_diff(p, ref_params[k]) for k, p in ours.named_parameters()),
        "torch": max(um.rel_diff(p, dict(theirs.named_parameters())[k]) for k, p in ours.named_parameters()),
        "dtypes": [p.dtype for p in ours.parameters()] == [p.dtype for p in ref_model.parameters()],
        "tied": ours.head.weight is ours.emb.weight if name == "tied" else True,
    }

# without find_unused_parameters an unused parameter is refused, as PyTorch's DDP refuses it
model = DistributedDataParallel(um.build("branch"))
try:
    um.loss(model, "branch", *um.batch("branch", 1), step=1).backward()
    results["refused"] = None
except RuntimeError as error:
    results["refused"] = str(error)
if r == 0:
    runtime.publish("results", results)
runtime.shutdown()
