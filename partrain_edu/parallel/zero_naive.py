"""ZeRO-1 and ZeRO-2, naive (朴素版): the whole model's trainable parameters as one flat buffer, cut in n shards.

    zero = NaiveZero(model, torch.optim.AdamW, group, stage=1, lr=3e-3)     # every rank; group: None = world
    loss_fn(model(my_slice), y).backward(); zero.step(); zero.zero_grad()

Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
arXiv:1910.02054, §5.1–5.2. **Sharded**: the Ψ trainable elements are laid end to end, padded to n·s
(s = ⌈Ψ/n⌉); rank k's optimizer holds the states of elements [k·s, (k+1)·s) only (stage 1); stage 2 also frees
the full gradient once `step()` has reduce-scattered it, so only the shard's 1/n lives through the update and the
all-gather (ZeroOptimizer's stage 2 drops it as each backward ends, before the next micro-batch). **Sent** per
step (§7.2.1): a reduce-scatter of the gradient and an all-gather of the updated shards, 2(n−1)/n·Ψ·bytes
(fp32: 4) — DDP's all-reduce, in its two halves.
Run it on 2 ranks: notebook 04's `%%torchrun` cell beside ZeroOptimizer, or tests/test_naive_zero_fsdp.py.
One param group (the optimizer's kwargs hold for every element), every trainable parameter used every step;
zero.py's ZeroOptimizer adds what this leaves out (its docstring, docs/pytorch_semantics.md).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class NaiveZero:
    """`optimizer_class(**kwargs)` over this rank's flat shard of `model`'s trainable parameters (frozen ones are
    left alone). `step()`: reduce-scatter the gradients, step the shard, all-gather it back into the model."""

    def __init__(self, model: nn.Module, optimizer_class, group, stage: int = 1, **kwargs):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 or 2, got {stage}: stage 3 shards the parameters, see fsdp_naive.py")
        self.params = [p for p in model.parameters() if p.requires_grad]
        kinds = sorted({f"{p.dtype} on {p.device}" for p in self.params})
        if len(kinds) != 1:
            raise ValueError(f"NaiveZero lays the trainable parameters in ONE flat buffer: one dtype on one device, "
                             f"got {kinds or 'no trainable parameter'}; cast the model (model.float()) or use "
                             "zero.ZeroOptimizer, which keeps one buffer per dtype")
        self.group, self.stage = group, stage
        self.n, rank = dist.get_world_size(group), dist.get_rank(group)
        src = dist.get_global_rank(group or dist.group.WORLD, 0)
        for t in [*model.parameters(), *model.buffers()]:    # every replica starts from rank 0's weights
            dist.broadcast(t.data, src=src, group=group)
        self.numel = sum(p.numel() for p in self.params)      # Ψ
        self.s = -(-self.numel // self.n)                      # s = ⌈Ψ/n⌉
        full = self.flatten([p.detach() for p in self.params])
        self.shard = nn.Parameter(full[rank * self.s:(rank + 1) * self.s].clone())   # (s,) all the optimizer sees
        self.optimizer = optimizer_class([self.shard], **kwargs)

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """(n·s,) the tensors laid end to end in the parameters' order, zero padded."""
        return F.pad(torch.cat([t.reshape(-1) for t in tensors]), (0, self.n * self.s - self.numel))

    @torch.no_grad()
    def step(self) -> None:
        if any(p.grad is None for p in self.params):
            raise RuntimeError("a trainable parameter got no gradient: NaiveZero would still move it (its flat shard "
                               "steps every element); freeze it (requires_grad=False) or use zero.ZeroOptimizer")
        # 1. reduce-scatter: this rank's shard of the gradient, averaged over the ranks (divided first, as DDP)
        grad = self.flatten([p.grad for p in self.params]).div_(self.n)   # (n·s,)
        self.shard.grad = torch.empty_like(self.shard)                      # (s,)
        dist.reduce_scatter_single(self.shard.grad, grad, group=self.group)
        if self.stage == 2:                                                 # ZeRO-2: the full gradient goes
            for p in self.params:
                p.grad = None
        # 2. the optimizer steps this rank's elements only: its states are 1/n of one process's
        self.optimizer.step()
        # 3. all-gather: every rank's updated shard, copied back into the model's parameters
        full = torch.empty(self.n * self.s, dtype=self.shard.dtype, device=self.shard.device)   # (n·s,)
        dist.all_gather_single(full, self.shard.detach(), group=self.group)
        for p, new in zip(self.params, full[:self.numel].split([p.numel() for p in self.params]), strict=True):
            p.copy_(new.view_as(p))

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        self.shard.grad = None
