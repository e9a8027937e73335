"""`ddp-bf16`, `zero3-bf16`, `torch-fsdp-bf16`: `ddp`, `zero3`, `torch-fsdp` computing and communicating in bf16.

    partrain-edu train --strategy ddp-bf16 --nproc 2 --steps 5 --json
    partrain-edu train --strategy zero3-bf16 --nproc 2 --steps 5 --json

Micikevicius et al. 2018 ("Mixed Precision Training"); Rajbhandari et al. 2020 ("ZeRO", §3.1). TinyGPT's
parameters stay fp32 — the master weights AdamW updates, with fp32 moments; forward and backward run in bf16,
the logits are cast to fp32 before the loss. Gradients are reduced in bf16 (half of the fp32 strategy's bytes,
measured by `CommTracer`): a choice these strategies make so that notebook 12 can measure the trade, not the
reference stacks' default — Megatron-LM (`accumulate_allreduce_grads_in_fp32`) and torchtitan
(`mixed_precision_reduce = "float32"`) reduce bf16 gradients in fp32, which adds no bf16 rounding per ring hop.
Held per parameter (`state_bytes`, read from tensors):
- ddp-bf16: params 2 (the bf16 copy) · grads 2 + 4 (bf16 buckets; fp32 `.grad`, the accumulation buffer) ·
  optimizer 4 + 4 + 4 (master, m, v) — ZeRO's 2 + 2 + 12 plus the fp32 buffer: 20 B (Megatron-Core's 2 + 4 + 12
  = 18 keeps the fp32 buffer only, and reduces it).
- zero3-bf16 (`fsdp.MixedPrecision`) and torch-fsdp-bf16 (FSDP2's `MixedPrecisionPolicy`): the fp32 shard is
  the master (4/n), its fp32 gradient (4/n), m and v (8/n); the bf16 copy exists only gathered, per unit.
Losses match `single`'s within 2⁻⁸ ≈ 3.9e-3 relative over 5 steps — one bf16 rounding (8 significant bits):
measured 5.7e-4 at 2 ranks; the three bf16 strategies give the same losses as one another.
"""
from __future__ import annotations

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from partrain_edu.parallel.ddp import DistributedDataParallel
from partrain_edu.parallel.mixed_precision import MixedPrecision
from partrain_edu.strategies.base import Strategy, optimizer_state_tensors, register, tensor_bytes
from partrain_edu.strategies.fsdp import Zero3
from partrain_edu.strategies.torch_fsdp import TorchFSDP

BF16 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, output_dtype=torch.float32)


@register("ddp-bf16")
class DDPBf16(Strategy):
    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.model = DistributedDataParallel(self.new_model(), mixed_precision=BF16)
        self.optimizer = self.new_optimizer(self.model.parameters())     # the fp32 masters

    def state_tensors(self):
        masters = list(self.model.parameters())
        return {"params": list(self.model.compute.copies.values()),      # bf16: what forward computes with
                "grads": [b.buffer for b in self.model.buckets] + [p.grad for p in masters if p.grad is not None],
                "optimizer": masters + optimizer_state_tensors(self.optimizer)}

    def held_by_kind(self) -> dict[str, int]:
        """Bytes of each kind of tensor this rank holds: Playbook's 2 + 2 + 4 + 4 + 4 (+ 4), measured."""
        masters = list(self.model.parameters())
        states = [self.optimizer.state[p] for p in masters if p in self.optimizer.state]
        return {"bf16 copy (forward and backward)": tensor_bytes(self.model.compute.copies.values()),
                "bf16 gradients (the buckets sent)": tensor_bytes(b.buffer for b in self.model.buckets),
                "fp32 master weights": tensor_bytes(masters),
                "fp32 AdamW m": tensor_bytes(s["exp_avg"] for s in states),
                "fp32 AdamW v": tensor_bytes(s["exp_avg_sq"] for s in states),
                "fp32 gradients (accumulation buffer)": tensor_bytes(p.grad for p in masters if p.grad is not None),
                "AdamW step counters": tensor_bytes(s["step"] for s in states)}


@register("zero3-bf16")
class Zero3Bf16(Zero3):
    def __init__(self, ctx, cfg, group=None, prefetch: bool = False):
        super().__init__(ctx, cfg, group, prefetch, mixed_precision=BF16)


@register("torch-fsdp-bf16")
class TorchFSDPBf16(TorchFSDP):
    def __init__(self, ctx, cfg):
        policy = MixedPrecisionPolicy(param_dtype=BF16.param_dtype, reduce_dtype=BF16.reduce_dtype,
                                      output_dtype=BF16.output_dtype)
        super().__init__(ctx, cfg, mp_policy=policy)
