"""Rank side of tests/test_tp_pp_generic.py: `parallelize` and the pipeline pieces on models the library has never
seen (tests/unseen_tp_pp_models.py), each against one process on the same batch, the MLP also against DTensor's
`parallelize_module`. Every rank measures its own largest differences; rank 0 publishes them all.
Run: torchrun --nproc-per-node N tests/ranks/tp_pp_generic.py."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unseen_tp_pp_models as um  # noqa: E402
from partrain_edu import runtime  # noqa: E402
from partrain_edu.comm import CommTracer  # noqa: E402
from partrain_edu.parallel.pipeline import PipelineExecutor, Stage, infer_boundaries, split_layers  # noqa: E402
from partrain_edu.parallel.pp_comm import Mailbox  # noqa: E402
from partrain_edu.parallel.sequence import SequenceParallelRegion  # noqa: E402
from partrain_edu.parallel.tensor import TensorParallelRegion, full_slice, parallelize, vocab_parallel_cross_entropy  # noqa: E402
from partrain_edu.theory.schedules import build_schedule  # noqa: E402

ctx = runtime.init()
n, r = ctx.world_size, ctx.rank
group = dist.new_group(list(range(n)))
out = {}


def diff(a, b):
    """Largest |a − b| relative to the largest |b|."""
    a, b = a.detach().float(), b.detach().float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def grad_gap(model, full, region):
    """Largest gap between a shard's gradient and its slice of the one-process gradient, and whether every
    parameter has one."""
    full_params = dict(full.named_parameters())
    gaps = [diff(p.grad, full_slice(full_params[k].grad, p, region)) for k, p in model.named_parameters()]
    return max(gaps), all(p.grad is not None for p in model.parameters())


# -- (a) tensor parallelism: a plain MLP, by our plan and by DTensor's ----------------------------------------
x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
probe = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))   # a loss with a non-uniform gradient
full, x_full = um.plain_mlp(), x.clone().requires_grad_()
y_full = full(x_full)
(y_full * probe).sum().backward()

ours, x_ours = parallelize(um.plain_mlp(), {"0": "colwise", "2": "rowwise"}, group), x.clone().requires_grad_()
y_ours = ours(x_ours)
(y_ours * probe).sum().backward()
gap, complete = grad_gap(ours, full, group)
res = {"output": diff(y_ours, y_full), "input_grad": diff(x_ours.grad, x_full.grad), "grads": gap,
       "complete": complete, "widths": [ours[0].weight.shape[0], ours[2].weight.shape[1]]}

theirs = parallelize_module(um.plain_mlp(), init_device_mesh("cpu", (n,)),
                            {"0": ColwiseParallel(), "2": RowwiseParallel()})
x_theirs = x.clone().requires_grad_()
y_theirs = theirs(x_theirs)
(y_theirs * probe).sum().backward()
ours_params = dict(ours.named_parameters())
res["dtensor"] = {"output": diff(y_ours, y_theirs), "input_grad": diff(x_ours.grad, x_theirs.grad),
                  "local_grads": max(diff(ours_params[k].grad, p.grad.to_local())
                                     for k, p in theirs.named_parameters()),
                  "local_weights": max(diff(ours_params[k], p.to_local()) for k, p in theirs.named_parameters())}
out["mlp"] = res

# -- (a) an attention + MLP language model: tensor parallel with and without `inputs`, and sequence parallel ---
idx = torch.randint(0, um.AttentionLM.VOCAB, (4, um.AttentionLM.SEQ), generator=torch.Generator().manual_seed(3))
targets = torch.randint(0, um.AttentionLM.VOCAB, idx.shape, generator=torch.Generator().manual_seed(4))
full = um.AttentionLM()
reference = F.cross_entropy(full(idx).flatten(0, 1), targets.flatten())
reference.backward()
for name, region, inputs in [("tp", TensorParallelRegion(group), um.LM_INPUTS), ("tp-default-f", group, None),
                             ("sp", SequenceParallelRegion(group), um.LM_INPUTS)]:
    model = parallelize(um.AttentionLM(), um.LM_PLAN, region, inputs=inputs)
    if name == "sp":
        model.pos = region.positions(model.pos)      # this rank's T/t positions of every sequence
    region = region if name != "tp-default-f" else TensorParallelRegion(group)
    tracer = CommTracer()
    with tracer:
        with tracer.label("forward"), region.saving():
            loss = vocab_parallel_cross_entropy(model(idx), targets, region)
        with tracer.label("backward"):
            loss.backward()
        region.finish_grads(model)
    gap, complete = grad_gap(model, full, region)
    counts = {}
    for rec in tracer.records:
        counts[f"{rec.label} {rec.op}"] = counts.get(f"{rec.label} {rec.op}", 0) + 1
    out[f"lm {name}"] = {"loss": diff(loss, reference), "grads": gap, "complete": complete, "calls": counts,
                         "heads": model.layers[0].attn.query.weight.shape[0] // model.layers[0].attn.head_dim}

# -- (b) pipeline parallelism: a stack of six differently shaped layers, any schedule --------------------------
B, M = 8, 4
xs = torch.randn(B, 8, generator=torch.Generator().manual_seed(5))
ys = torch.randn(B, 4, generator=torch.Generator().manual_seed(6))
full = um.widths_stack()
reference = F.mse_loss(full(xs), ys)
reference.backward()
full_params = dict(full.named_parameters())
runs = [("gpipe", 1, None), ("1f1b", 1, None)] + ([("interleaved", 2, None), ("1f1b", 1, [4])] if n == 2 else [])
for schedule_name, chunks, cuts in runs:
    model = um.widths_stack()
    ranges = split_layers(model, n * chunks, cuts)
    mine = [Stage(model, *ranges[c * n + r]) for c in range(chunks)]
    shapes = infer_boundaries(mine, r, list(range(n)), xs[:B // M])
    executor = PipelineExecutor(build_schedule(schedule_name, n, M, chunks), mine, r, list(range(n)),
                                Mailbox(shapes, M), F.mse_loss)
    loss_sum, count = executor.step(xs, ys)
    # a stage's parameter blocks.<i>.<rest> is the full stack's <i>.<rest>
    gaps = [diff(p.grad, full_params[k.removeprefix("blocks.")].grad) for c in mine for k, p in c.named_parameters()]
    out[f"pp {schedule_name} cuts={cuts}"] = {
        "loss": abs(loss_sum / count - reference.item()) / reference.item() if count else None,
        "grads": max(gaps), "ranges": ranges, "shapes": [list(s.shape) for s in shapes]}

everyone = [None] * n
dist.all_gather_object(everyone, out)
runtime.publish("results", everyone)
runtime.shutdown()
