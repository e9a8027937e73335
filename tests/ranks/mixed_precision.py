"""Rank side of tests/test_mixed_precision.py. (1) Every unseen model (tests/unseen_models.py) under our DDP
and our ZeRO-3 with bf16 compute and communication, fp32 master weights and AdamW states, two micro-batches
(DDP's first under no_sync), against one fp32 process on the whole batch and against one process computing in the
same bf16; the bytes sent beside fp32 DDP's. (2) The strategies ddp, zero3, torch-fsdp and their -bf16 twins, each
trained by the course's loop (`train.run`): their reports. Rank 0 publishes both.
Run: torchrun --nproc-per-node 2 tests/ranks/mixed_precision.py."""
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unseen_models as um  # noqa: E402
from partrain_edu import runtime  # noqa: E402
from partrain_edu.comm import CommTracer  # noqa: E402
from partrain_edu.parallel.ddp import DistributedDataParallel  # noqa: E402
from partrain_edu.parallel.fsdp import FullyShardedDataParallel  # noqa: E402
from partrain_edu.parallel.mixed_precision import LowPrecisionCopy, MixedPrecision  # noqa: E402
from partrain_edu.train import TrainConfig, run  # noqa: E402

STEPS = 4
STRATEGY_STEPS = 5
BF16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.float32)
ctx = runtime.init()
n, r = ctx.world_size, ctx.rank


class _OneProcess(torch.nn.Module):
    """One process computing through the same bf16 copy, no communication."""

    def __init__(self, module):
        super().__init__()
        self.module, self.compute = module, LowPrecisionCopy(module, BF16)

    def forward(self, *args, **kwargs):
        return self.compute(*args, **kwargs)


def by_name(model, fsdp):
    """AdamW's two groups chosen by the unwrapped model's names (FSDP's pieces are 1-D: shape cannot tell)."""
    matrices = {k for k, p in model.named_parameters() if p.dim() > 1}
    named = [(k, p) for k, p in fsdp.named_parameters() if p.requires_grad]
    return [{"params": [p for k, p in named if k in matrices], "weight_decay": 0.1},
            {"params": [p for k, p in named if k not in matrices], "weight_decay": 0.0}]


def train(name, model, sliced, groups=None):
    inner = model.module if hasattr(model, "module") else model
    opt = torch.optim.AdamW(groups or um.param_groups(inner), lr=1e-2)
    for step in range(STEPS):
        x, y = um.batch(name, step)
        if sliced:
            x, y = um.rank_slice(name, x, y, r, n)
        opt.zero_grad()
        half = len(x) // 2
        for xb, yb, last in ((x[:half], y[:half], False), (x[half:], y[half:], True)):
            with (model.no_sync() if not last and hasattr(model, "no_sync") else contextlib.nullcontext()):
                (um.loss(model, name, xb, yb, step) / 2).backward()
        opt.step()
    return inner, opt


results = {}
for name in um.MODELS:
    unused = name == "branch"
    ref, _ = train(name, um.build(name), sliced=False)
    ref_bf16, _ = train(name, _OneProcess(um.build(name)), sliced=False)
    sent = {}
    for label, mp in (("fp32", None), ("bf16", BF16)):
        ddp = DistributedDataParallel(um.build(name), find_unused_parameters=unused, mixed_precision=mp)
        with CommTracer() as tracer:                                 # the training steps, not the broadcast
            ours, opt = train(name, ddp, sliced=True)
        sent[label] = tracer.summary_of_max_sender(per_step=False)
    model = um.build(name)                  # ZeRO-3 with fsdp.MixedPrecision: each Linear its own unit
    zero3 = FullyShardedDataParallel(model, units=lambda k, m: isinstance(m, torch.nn.Linear), mixed_precision=BF16)
    train(name, zero3, sliced=True, groups=by_name(model, zero3))
    zero3_params = zero3.state_dict()
    ref_params, bf16_params = dict(ref.named_parameters()), dict(ref_bf16.named_parameters())
    results[name] = {
        "single": max(um.rel_diff(p, ref_params[k]) for k, p in ours.named_parameters()),
        "single_bf16": max(um.rel_diff(p, bf16_params[k]) for k, p in ours.named_parameters()),
        "zero3": max(um.rel_diff(zero3_params[k], p) for k, p in ref_params.items()),
        "dtypes": [p.dtype for p in ours.parameters()] == [p.dtype for p in ref.parameters()],
        "tied": ours.head.weight is ours.emb.weight if name == "tied" else True,
        "sent": sent,
        "copies": sorted({str(c.dtype) for c in ddp.compute.copies.values()}),
        "buckets": sorted({str(b.buffer.dtype) for b in ddp.buckets}),
        "state_dict": {k: str(v.dtype) for k, v in ddp.module.state_dict().items()} ==
                      {k: str(v.dtype) for k, v in ref.state_dict().items()},
    }
    if name == "batchnorm":                 # the running statistics: trained by forward, kept in fp32
        results[name]["buffers"] = {"dtype": str(ours.bn.running_mean.dtype), "moved": bool(ours.bn.running_mean.any()),
                                    "batches": [int(m.bn.num_batches_tracked) for m in (ours, ref)]}

reports = {}
for strategy in ("ddp", "ddp-bf16", "zero3", "zero3-bf16", "torch-fsdp", "torch-fsdp-bf16"):
    runtime.seed_everything(0)
    reports[strategy] = run(ctx, TrainConfig(strategy=strategy, nproc=n, steps=STRATEGY_STEPS))
if r == 0:
    runtime.publish("results", results)
    runtime.publish("reports", reports)
runtime.shutdown()
