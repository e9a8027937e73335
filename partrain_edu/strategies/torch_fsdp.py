"""torch-fsdp: PyTorch's own ZeRO-3, FSDP2 (`torch.distributed.fsdp.fully_shard`), beside our `zero3`.

    partrain-edu train --strategy torch-fsdp --nproc 2 --steps 20 --json

Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel". The same units as
`zero3` (strategies/fsdp.py): `fully_shard` on each transformer block, then on the whole model (the root:
embeddings, final layernorm, head). FSDP2 turns every parameter into a DTensor sharded on dim 0 over a 1-D `DeviceMesh`
(the context's device mesh, `ctx.with_layout(dp=n, use_mesh=True)`, runs on Gloo); AdamW then updates the local shards.

Sharded: params, grads and AdamW states, each ≈ 1/n per rank (FSDP2 pads each parameter's dim 0 to a multiple
of n, where ours pads each unit's flat buffer). Communicated per unit and micro-batch: all-gather before
forward, all-gather before backward, reduce-scatter of the gradients after backward — 1.5× DDP's bytes.

What `comm` reports: FSDP2 issues its collectives from Python through `torch.distributed.all_gather_single`
and `torch.distributed.reduce_scatter_single` (its `DefaultAllGather` / `DefaultReduceScatter`), so
`CommTracer` counts them itself, priced by the ring model — the same op names as our `zero3`. No
`comm.adapters.FunctionalCollectiveCounter` is needed: wrapped around this loop it finds no functional
collective, and as a dispatch mode it would slow every op ~4× (it would distort the benchmark
`benchmarks/zero3_vs_fsdp.py`). One difference in bytes: FSDP2 keeps the root
unit gathered from the end of forward into backward (it is needed first there), so it all-gathers the root
once per step, not twice: slightly under 1.5× DDP.
"""
from __future__ import annotations

import dataclasses
import warnings

from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from partrain_edu.strategies.base import Strategy, register


@register("torch-fsdp")
class TorchFSDP(Strategy):
    def __init__(self, ctx, cfg, mp_policy: MixedPrecisionPolicy | None = None):
        super().__init__(ctx, cfg)
        mp_policy = mp_policy or MixedPrecisionPolicy()      # the default: no casts (torch-fsdp-bf16 passes bf16)
        # Two warnings FSDP2 raises on every step that do not apply here: the loop never modifies the output
        # in place, and token ids (the input) never require gradients.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
        self.ctx = ctx.with_layout(dp=self.dp, use_mesh=True)        # the grid's mesh; its "dp" dimension
        mesh = self.ctx.topology.mesh["dp"]
        model = self.new_model()                     # the same init on every rank: nothing to broadcast
        for block in model.blocks:
            # one unit per block; only the root casts its output (the logits), as our zero3's does
            fully_shard(block, mesh=mesh, mp_policy=dataclasses.replace(mp_policy, output_dtype=None))
        self.model = fully_shard(model, mesh=mesh, mp_policy=mp_policy)   # the root unit: everything else
        self.optimizer = self.new_optimizer(self.model.parameters())
