"""Rank side of tests/test_fsdp_generic.py: every unseen model wrapped by FullyShardedDataParallel (units by a
policy and by a list), trained on this rank's slice of the batch, and by plain AdamW on the whole batch in one
process; also mixed precision, the bytes one step sends, and PyTorch's FSDP2 on the same model. Rank 0
publishes the largest differences. Run: torchrun --nproc-per-node N tests/ranks/fsdp_generic.py."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unseen_models as um  # noqa: E402
from partrain_edu import runtime  # noqa: E402
from partrain_edu.comm import CommTracer  # noqa: E402
from partrain_edu.parallel.fsdp import FullyShardedDataParallel, MixedPrecision  # noqa: E402

STEPS = 4
ctx = runtime.init()
n, r = ctx.world_size, ctx.rank
LAYERS = (nn.Linear, nn.Embedding, nn.BatchNorm1d)
POLICY = lambda name, m: isinstance(m, LAYERS)  # noqa: E731  every layer its own unit: the root owns nothing
LISTS = {"frozen": ["frozen"], "branch": ["rare"], "tied": ["emb", "head"], "batchnorm": ["bn"], "mixed": [],
         "uneven": ["a", "b"]}   # tied: the weight both units use goes to the root, leaving them empty


def groups(named, matrices, wd=0.1):
    """AdamW's two groups, chosen by name (FSDP's pieces are 1-D: their shape cannot tell a bias)."""
    ps = [(k, p) for k, p in named if p.requires_grad]
    return [{"params": [p for k, p in ps if k in matrices], "weight_decay": wd},
            {"params": [p for k, p in ps if k not in matrices], "weight_decay": 0.0}]


def train(name, model, opt, sliced, microbatches=1, steps=STEPS):
    return um.train(name, model, opt, (r, n) if sliced else (0, 1), microbatches, steps)


def full_optimizer_state(fsdp, opt):
    """{name: {key: full tensor or step}} built from every rank's pieces (a collective)."""
    where = {id(piece): (flat, i) for flat in fsdp.flat_shards() for i, piece in enumerate(flat.pieces)}
    out = {}
    for name, piece in fsdp.named_parameters():
        flat, i = where[id(piece)]
        st = opt.state.get(piece, {})
        held = [None] * n
        dist.all_gather_object(held, (sorted(st), float(st["step"]) if st else None))
        if not held[0][0]:
            continue
        a, b, shape = flat.spans[i]
        out[name] = {"step": held, **{k: flat.gather_state([opt.state.get(q, {}).get(k) for q in flat.pieces])[a:b]
                                      .view(shape) for k in ("exp_avg", "exp_avg_sq")}}
    return out


def compare(name, units, microbatches=1, mp=None):
    ref = um.build(name)
    matrices = {k for k, p in ref.named_parameters() if p.dim() > 1}
    ref_opt = torch.optim.AdamW(groups(ref.named_parameters(), matrices), lr=1e-2)
    train(name, ref, ref_opt, sliced=False, microbatches=microbatches)
    model = um.build(name)
    if isinstance(units, list):
        units = [model.get_submodule(k) for k in units]
    tied_seen = []
    if name == "tied":
        model.head.register_forward_pre_hook(lambda mod, args: tied_seen.append(mod.weight is model.emb.weight))
    fsdp = FullyShardedDataParallel(model, units=units, mixed_precision=mp)
    opt = torch.optim.AdamW(groups(fsdp.named_parameters(), matrices), lr=1e-2)
    train(name, fsdp, opt, sliced=True, microbatches=microbatches)
    sd, ref_sd = fsdp.state_dict(), ref.state_dict()
    mine, theirs = full_optimizer_state(fsdp, opt), {k: ref_opt.state[p] for k, p in ref.named_parameters()
                                                     if p in ref_opt.state}
    res = {"keys": list(sd) == list(ref_sd),
           "params": max(um.rel_diff(sd[k], v) for k, v in ref_sd.items() if v.is_floating_point()),
           "ints": all(torch.equal(sd[k], v) for k, v in ref_sd.items() if not v.is_floating_point()),
           "dtypes": [v.dtype for v in sd.values()] == [v.dtype for v in ref_sd.values()],
           "state_names": sorted(mine) == sorted(theirs),
           "moments": max([um.rel_diff(mine[k][s], st[s]) for k, st in theirs.items() if k in mine
                           for s in ("exp_avg", "exp_avg_sq")] or [0.0]),
           "steps": all(h == (sorted(st), float(st["step"])) for k, st in theirs.items() if k in mine
                        for h in mine[k]["step"]),
           "units": [len(u.shards) for u in fsdp.units]}
    if name == "frozen":
        res["frozen_unchanged"] = torch.equal(sd["frozen.weight"], um.build(name).frozen.weight)
    if name == "tied":
        res["tied"] = (all(tied_seen) and len(tied_seen) == STEPS * microbatches
                       and len(list(fsdp.parameters())) == len(list(ref.parameters()))
                       and [k for k, _ in fsdp.named_parameters(remove_duplicate=False)].count("head.weight") == 1)
    # load_state_dict keeps this rank's chunk: a fresh wrapper of another init reads back the same state dict
    again = FullyShardedDataParallel(um.build(name, seed=1), units=POLICY)
    again.load_state_dict(sd)
    res["reloaded"] = all(torch.equal(v, sd[k]) for k, v in again.state_dict().items())
    return res


def one_step_bytes(name, mp):
    """Bytes one forward + backward sends, and what ZeRO-3 predicts from the padded units."""
    fsdp = FullyShardedDataParallel(um.build(name), units=POLICY, mixed_precision=mp)
    x, y = um.rank_slice(name, *um.batch(name, 0), r, n)
    with CommTracer() as tracer:
        um.loss(fsdp, name, x, y, 0).backward()
    sent = {op: v["bytes"] for op, v in tracer.summary().items()}
    gather = 2 if mp else 4
    padded = [f.padded for f in fsdp.flat_shards()]
    # padded per shard only
    assert all(p == -(-f.numel // n) * n for p, f in zip(padded, fsdp.flat_shards(), strict=True))
    theory = {"all_gather_single": sum(2 * (n - 1) * p * gather // n for p in padded),
              "reduce_scatter_single": sum((n - 1) * p * 4 // n for p in padded)}
    return {"sent": sent, "theory": theory, "shards": len(padded)}


results = {}
for name in um.MODELS:
    for kind, units in (("policy", POLICY), ("list", LISTS[name])):
        results[f"{name} {kind}"] = compare(name, units)
results["branch policy m2"] = compare("branch", POLICY, microbatches=2)
results["uneven list m2"] = compare("uneven", LISTS["uneven"], microbatches=2)
bf16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for name in ("branch", "tied"):
    results[f"{name} mixed precision"] = compare(name, POLICY, mp=bf16)
# tied: every unit's weights are read again in backward (the root's through the head), so all three collectives
results["traffic fp32"] = one_step_bytes("tied", None)
results["traffic bf16"] = one_step_bytes("tied", bf16)

# PyTorch's own FSDP2 on the same model and slices: a unit per layer, then the root
theirs = um.build("uneven")
mesh = init_device_mesh("cpu", (n,))
for layer in (theirs.a, theirs.b):
    fully_shard(layer, mesh=mesh)
fully_shard(theirs, mesh=mesh)
ours = FullyShardedDataParallel(um.build("uneven"), units=POLICY)
for model in (theirs, ours):
    train("uneven", model, torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1), sliced=True)
mine = ours.state_dict()
start = um.build("uneven").state_dict()
results["uneven vs fully_shard"] = {"params": max(um.rel_diff(mine[k], p.full_tensor())
                                                   for k, p in theirs.named_parameters()),
                                    "moved": min(um.rel_diff(mine[k], v) for k, v in start.items())}

if r == 0:
    runtime.publish("results", results)
runtime.shutdown()
