"""Rank side of tests/test_zero_optimizer.py: every unseen model trained by ZeroOptimizer (stages 1 and 2) on
this rank's slice of the batch, and by a plain optimizer on the whole batch in one process; rank 0 publishes
the largest differences. Run: torchrun --nproc-per-node N tests/ranks/zero_optimizer.py."""
import os
import sys

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as TorchDDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unseen_models as um  # noqa: E402
from partrain_edu import runtime  # noqa: E402
from partrain_edu.parallel.zero import ZeroOptimizer  # noqa: E402

STEPS = 4
ctx = runtime.init()
n, r = ctx.world_size, ctx.rank


def train(name, model, opt, sliced, microbatches=1, steps=STEPS):
    return um.train(name, model, opt, (r, n) if sliced else (0, 1), microbatches, steps)


def state_diff(mine, ref):
    if set(mine["state"]) != set(ref["state"]):
        return f"state for params {sorted(mine['state'])}, one process {sorted(ref['state'])}"
    worst = 0.0
    for i, st in ref["state"].items():
        if set(st) != set(mine["state"][i]):
            return f"param {i}: keys {sorted(mine['state'][i])} vs {sorted(st)}"
        for k, v in st.items():
            got = mine["state"][i][k]
            worst = max(worst, um.rel_diff(got, v) if v.dim() else abs(float(got) - float(v)))
    return worst


results = {}
cases = [(name, stage, "adamw", 1) for name in um.MODELS for stage in (1, 2)]
cases += [("branch", 1, "sgd", 1), ("branch", 2, "sgd", 2), ("uneven", 2, "adamw", 2)]
for name, stage, kind, m in cases:
    make = (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)) if kind == "sgd" else \
        (lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    ref_model = um.build(name)
    ref_opt = make(um.param_groups(ref_model))
    train(name, ref_model, ref_opt, sliced=False, microbatches=m)
    model = um.build(name)
    opt_class = torch.optim.SGD if kind == "sgd" else torch.optim.AdamW
    kwargs = {"lr": 0.05, "momentum": 0.9} if kind == "sgd" else {"lr": 1e-2}
    opt = ZeroOptimizer(um.param_groups(model), opt_class, stage=stage, **kwargs)
    train(name, model, opt, sliced=True, microbatches=m)
    sd = opt.state_dict()
    ref_params = dict(ref_model.named_parameters())
    res = {
        "params": max(um.rel_diff(p, ref_params[k]) for k, p in model.named_parameters()),
        "buffers": max([um.rel_diff(b, dict(ref_model.named_buffers())[k]) for k, b in model.named_buffers()
                        if b.is_floating_point()] or [0.0]),
        "dtypes": [str(p.dtype) for p in model.parameters()] == [str(p.dtype) for p in ref_model.parameters()],
        "state": state_diff(sd, ref_opt.state_dict()),
        "groups": [{k: v for k, v in g.items() if k != "params"} for g in sd["param_groups"]]
        == [{k: v for k, v in g.items() if k != "params"} for g in ref_opt.state_dict()["param_groups"]],
    }
    if name == "frozen":
        res["frozen_unchanged"] = torch.equal(model.frozen.weight, um.build(name).frozen.weight)
    # load_state_dict round trip: a fresh optimizer loads the full state and continues identically
    again = ZeroOptimizer(um.param_groups(model), opt_class, stage=stage, **kwargs)
    again.load_state_dict(sd)
    res["reloaded"] = state_diff(again.state_dict(), sd)
    results[f"{name} stage{stage} {kind} m{m}"] = res

# PyTorch's own: DDP + ZeroRedundancyOptimizer on the same replicas, the same slices
for name in ("frozen", "uneven"):
    theirs = TorchDDP(um.build(name))
    zro = ZeroRedundancyOptimizer([p for p in theirs.parameters() if p.requires_grad],
                                  optimizer_class=torch.optim.AdamW, lr=1e-2, weight_decay=0.0)
    # ZeroRedundancyOptimizer takes one param group at construction: compare with groups of equal decay
    model2 = um.build(name)
    opt2 = ZeroOptimizer([p for p in model2.parameters() if p.requires_grad], torch.optim.AdamW, stage=1,
                         lr=1e-2, weight_decay=0.0)
    train(name, model2, opt2, sliced=True)
    train(name, theirs, zro, sliced=True)
    results[f"{name} vs ZeroRedundancyOptimizer"] = {
        "params": max(um.rel_diff(p, dict(theirs.module.named_parameters())[k]) for k, p in model2.named_parameters())}

if r == 0:
    runtime.publish("results", results)
runtime.shutdown()
