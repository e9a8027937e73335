"""Rank side of tests/test_zero_bubble.py: 4 ranks on the emulated A100 (its clock times the pipelines; the
arithmetic is exact). (a) A stack of six differently shaped layers the library never saw (tests/unseen_tp_pp_models.py)
under the executor's ZB-H1 and 1F1B against one process, with the order each rank ran and what it stashed.
(b) `pp-1f1b` and `pp-zb1` trained by `train.run` on the emulated device: losses and the measured bubble.
Rank 0 publishes everything; the test compares it with the simulator and with `single`.
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import unseen_tp_pp_models as um  # noqa: E402
from partrain_edu import runtime  # noqa: E402
from partrain_edu.config import TrainConfig  # noqa: E402
from partrain_edu.parallel.pipeline import PipelineExecutor, Stage, infer_boundaries, split_layers  # noqa: E402
from partrain_edu.parallel.pp_comm import Mailbox  # noqa: E402
from partrain_edu.theory.schedules import build_schedule  # noqa: E402
from partrain_edu.train import run  # noqa: E402

DEVICE = "emulated:a100"
ctx = runtime.init(device=DEVICE)
p, r, B, M = ctx.world_size, ctx.rank, 16, 8
out = {"unseen": {}}

xs = torch.randn(B, 8, generator=torch.Generator().manual_seed(5))
ys = torch.randn(B, 4, generator=torch.Generator().manual_seed(6))
full = um.widths_stack()
F.mse_loss(full(xs), ys).backward()
reference = dict(full.named_parameters())
for name in ("zb-h1", "1f1b"):
    model = um.widths_stack()
    stage = Stage(model, *split_layers(model, p)[r])
    executor = PipelineExecutor(build_schedule(name, p, M), [stage], r, list(range(p)),
                                Mailbox(infer_boundaries([stage], r, list(range(p)), xs[:B // M]), M), F.mse_loss)
    executor.step(xs, ys)
    gaps = [float((q.grad - reference[k.removeprefix("blocks.")].grad).abs().max()
                  / reference[k.removeprefix("blocks.")].grad.abs().max()) for k, q in stage.named_parameters()]
    out["unseen"][name] = {"grad_gap": max(gaps), "peak": executor.peak,
                           "ran": [(e["kind"], e["microbatch"]) for e in executor.events],
                           "grads": {k: q.grad.clone() for k, q in stage.named_parameters()}}

for strategy in ("pp-1f1b", "pp-zb1"):
    report = run(ctx, TrainConfig(strategy, nproc=p, steps=2, microbatches=M, device=DEVICE))
    out[strategy] = {"losses": report["losses"], "bubble": report["emulated"]["bubble"]}

everyone = [None] * p
dist.all_gather_object(everyone, out)
runtime.publish("results", everyone)
runtime.shutdown()
