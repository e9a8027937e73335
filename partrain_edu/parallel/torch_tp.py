"""PyTorch's own tensor parallelism — DTensor and `parallelize_module` — run beside ours (tensor.py).

    partrain-edu train --strategy torch-tp --nproc 2 --tp 2 --steps 20 --json

**Sharded**: exactly what `tp` shards, from the same `TP_PLAN`, each style turned into its DTensor
counterpart on a 1-D `DeviceMesh` ("cpu" with Gloo, "cuda" with NCCL): "colwise" → `ColwiseParallel`
(weight `Shard(0)`), "rowwise" → `RowwiseParallel` (`Shard(1)`), "vocab" → `RowwiseParallel` on the embedding
(its rows are tokens). The head keeps its logits split by vocabulary (`Shard(-1)`) and the loss runs under
`loss_parallel()`, PyTorch's vocab-parallel cross-entropy. Parameters, gradients and AdamW states are DTensors
whose local shards are what a rank holds (`state_bytes` counts those).

**Communicated**: the same all-reduces as `tp` — 2 forward + 2 backward per layer of b·s·h elements, 1 forward
for the embedding, 1 backward for the head's input, 3 forward of b·s for the loss — but DTensor decides them
itself when a tensor's layout must change (Partial → Replicate is an all-reduce). One detail has to be said:
q, k and v read the same input; left alone, each `ColwiseParallel` would turn it into a DTensor and all-reduce
its own gradient (3 backward all-reduces). `PrepareModuleInput` on the attention makes the input a DTensor once,
so the three gradients are summed locally and all-reduced once, as our f does.

**What `comm` reports**: DTensor communicates through functional collectives (`torch.ops._c10d_functional`),
which a `CommTracer` cannot see. PyTorch's `CommDebugMode` (a TorchDispatchMode) sees them, forward and
backward, per module, but counts calls only. `comm_adapters.FunctionalCollectiveCounter` extends it with each call's payload
S — the full tensor: the input of an all-reduce or reduce-scatter, t × the input of an all-gather — priced
under the same ring model as `CommTracer` and `theory.traffic`, and adds one `CommRecord` per call (labelled
"forward"/"backward") to the active tracer. So `comm` has the same {op: {calls, bytes}} shape and meaning as
for `tp`, and the two can be compared number for number.
"""
from __future__ import annotations

import contextlib
import warnings

from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               loss_parallel, parallelize_module)

from partrain_edu.comm_adapters import FunctionalCollectiveCounter
from partrain_edu.parallel.tensor import TP_PLAN, TensorParallel
from partrain_edu.train import register

def dtensor_plan() -> dict:
    """TP_PLAN in DTensor's words (the `parallelize_module` plan)."""
    styles = {"colwise": ColwiseParallel(), "rowwise": RowwiseParallel(),
              "vocab": RowwiseParallel(input_layouts=Replicate())}  # token ids are whole on every rank
    plan = {pattern: styles[style] for pattern, style in TP_PLAN.items()}
    plan["head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)  # for loss_parallel
    # One DTensor input shared by q, k, v: their input gradients are summed, then all-reduced once (f).
    plan["blocks.*.attn"] = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
                                               use_local_output=False)
    return plan


def parallelize_tinygpt(model, mesh):
    """`parallelize_module` with `dtensor_plan()`, in place; returns the model."""
    parallelize_module(model, mesh, dtensor_plan())
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
        self.mesh = init_device_mesh(self.ctx.device.type, (self.tp,), mesh_dim_names=("tp",))
        return parallelize_tinygpt(self.new_model(), self.mesh)

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        counter = FunctionalCollectiveCounter() if self.count_collectives else contextlib.nullcontext()
        with counter, loss_parallel(), warnings.catch_warnings():
            # CommDebugMode's module tracker warns that the embedding's input (token ids) needs no gradient.
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            loss_sum, count = self.accumulate(self.model, x, y)  # TinyGPT.loss on Shard(-1) logits
        self.optimizer.step()
        return (loss_sum, count) if self.mesh.get_local_rank() == 0 else (0.0, 0)
