"""`torch-tp`: PyTorch's own tensor parallelism (DTensor, `parallelize_module`) on `tp`'s layout and plan.

    partrain-edu train --strategy torch-tp --nproc 2 --tp 2 --steps 20 --json

Sharded: what `tp` shards, from the same TP_PLAN turned into DTensor styles (`parallel.torch_tp.dtensor_plan`,
`PrepareModuleInput` on the attention so q, k and v share one f) on a 1-D ("tp",) `DeviceMesh`; the head keeps its
logits split by vocabulary (`Shard(-1)`) and the loss runs under `loss_parallel()`, PyTorch's vocab-parallel
cross-entropy. Sent: the same all-reduces as `tp`, 4 · 2(t−1)/t · b·s·h·e bytes per rank per layer, which
DTensor issues itself when a layout must change.

What `comm` reports: DTensor communicates through functional collectives, which `CommTracer` cannot see.
`comm.adapters.FunctionalCollectiveCounter` (PyTorch's `CommDebugMode`, plus each call's payload priced by
the ring model) adds one `CommRecord` per call to the active tracer, so `comm` reads number for number as `tp`'s.
"""
from __future__ import annotations

import contextlib
import warnings

from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

from partrain_edu.comm.adapters import FunctionalCollectiveCounter
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.torch_tp import dtensor_plan
from partrain_edu.strategies.base import register
from partrain_edu.strategies.tensor import TP_PLAN, TensorParallel


def tinygpt_dtensor_plan() -> dict:
    """TP_PLAN in DTensor's words, one DTensor input shared by q, k and v (their input gradients summed, then
    all-reduced once, as our f), and the head's logits left split for `loss_parallel`."""
    plan = dtensor_plan(TP_PLAN, inputs=("blocks.*.attn",))
    plan["head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan


def dtensor_parallelize_tinygpt(model: TinyGPT, mesh) -> TinyGPT:
    """`parallelize_module` with `tinygpt_dtensor_plan()`, in place; returns the model."""
    parallelize_module(model, mesh, tinygpt_dtensor_plan())
    for block in model.blocks:
        # TinyGPT's attention counts its heads from q.out_features; a DTensor Linear still reports the global
        # width, so tell it the local one (torchtitan likewise sets n_heads //= tp).
        block.attn.q.out_features = block.attn.q.weight.to_local().shape[0]
    return model


@register("torch-tp")
class TorchTensorParallel(TensorParallel):
    """Same layout and checks as `tp`; DTensor does the splitting and the communication."""

    count_collectives = True  # benchmarks switch it off to time the bare step (the counter adds Python work)

    def build_model(self):
        self.ctx = self.ctx.with_layout(tp=self.tp, use_mesh=True)  # the grid's mesh; its "tp" dimension
        self.mesh = self.ctx.topology.mesh["tp"]
        return dtensor_parallelize_tinygpt(self.new_model(), self.mesh)

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        counter = FunctionalCollectiveCounter() if self.count_collectives else contextlib.nullcontext()
        with counter, loss_parallel(), warnings.catch_warnings():
            # CommDebugMode's module tracker warns that the embedding's input (token ids) needs no gradient.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss_sum, count = self.accumulate(self.model, x, y)  # TinyGPT.loss on Shard(-1) logits
        self.optimizer.step()
        return (loss_sum, count) if self.mesh.get_local_rank() == 0 else (0.0, 0)
