"""Mixed precision (混合精度): compute in bf16, keep fp32 master weights and moments; reduce in `reduce_dtype`.

    ddp = DistributedDataParallel(model, mixed_precision=MixedPrecision(torch.bfloat16)); AdamW(ddp.parameters())
    partrain-edu train --strategy ddp-bf16 --nproc 2 --steps 5 --json      (zero3-bf16, torch-fsdp-bf16 beside it)

Micikevicius et al. 2018 ("Mixed Precision Training"): the module's own parameters stay fp32 — the master
weights any optimizer updates, its moments fp32 too. `LowPrecisionCopy` holds a bf16 copy of each one (2 B),
refreshed when the master has changed, and runs forward through it; backward casts each copy's gradient up and
autograd sums it into `master.grad`, fp32 — the gradient-accumulation buffer across micro-batches (4 B). On the
wire gradients travel in `reduce_dtype`, a choice: bf16 (DDP's bf16 buckets, 2 B) sends half of fp32's bytes and
rounds once per ring hop; fp32, Megatron-LM's and torchtitan's default for bf16 training, rounds less. Per parameter:
2 + 2 + 4 + 4 + 4 (+ 4 for the fp32 gradients) — ZeRO's 2 + 2 + 12 (Rajbhandari et al. 2020, §3.1) plus the
buffer DeepSpeed converts per partition at the step. bf16 keeps fp32's 8 exponent bits: no loss scaling;
fp16 (5 bits) needs it (notebook 12 shows a gradient that underflows). FSDP casts at each gather (fsdp.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.func import functional_call
from torch.utils._pytree import tree_map_only


@dataclass(frozen=True)
class MixedPrecision:
    """Compute floating parameters in `param_dtype` (forward inputs cast to it, as FSDP's cast_forward_inputs),
    reduce gradients in `reduce_dtype` (None: in param_dtype), cast floating outputs to `output_dtype` (None:
    leave them); the master weights keep their own dtype. The names of PyTorch FSDP2's MixedPrecisionPolicy."""
    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None

    def compute_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a `dtype` parameter is computed (and FSDP-gathered) in."""
        return self.param_dtype if self.param_dtype is not None and dtype.is_floating_point else dtype

    def wire_dtype(self, dtype: torch.dtype) -> torch.dtype:
        """The dtype a gradient of a `dtype` parameter is reduced in."""
        if not dtype.is_floating_point:
            return dtype
        return self.reduce_dtype or self.param_dtype or dtype


def cast_floating(tree, dtype: torch.dtype | None):
    """Every floating tensor in `tree` (args, kwargs, outputs) cast to `dtype`; None leaves them."""
    if dtype is None:
        return tree
    return tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, tree)


def full_precision_params(module: nn.Module) -> set[int]:
    """ids of the parameters that stay in their own dtype: those of a module with floating buffers (BatchNorm's
    running statistics), which must agree with them in dtype — as Apex and FSDP keep batch norm in fp32."""
    return {id(p) for m in module.modules() if any(b.is_floating_point() for b in m.buffers(recurse=False))
            for p in m.parameters(recurse=False)}


class _LowPrecision(torch.autograd.Function):
    """master → its low-precision copy (no cast: the copy is kept); backward: the gradient cast to the master's
    dtype, which autograd then sums into master.grad — fp32 accumulation however many micro-batches run."""

    @staticmethod
    def forward(ctx, master: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        ctx.dtype = master.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad.to(ctx.dtype), None


class LowPrecisionCopy:
    """Runs `module` with a `policy.param_dtype` copy of each floating parameter in place of the parameter.
    Tied parameters share one copy; a parameter already in that dtype is used as it is; buffers are left alone.
    `copies` are the 2-byte tensors this holds."""

    def __init__(self, module: nn.Module, policy: MixedPrecision):
        if policy.param_dtype is None or not policy.param_dtype.is_floating_point:
            raise ValueError(f"LowPrecisionCopy needs a floating param_dtype, got {policy.param_dtype}: pass "
                             "MixedPrecision(param_dtype=torch.bfloat16)")
        self.module, self.policy = module, policy
        self.names: dict[int, list[str]] = {}                 # id(master) → its names (tied: several)
        self.masters: dict[int, nn.Parameter] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            self.names.setdefault(id(p), []).append(name)
            self.masters[id(p)] = p
        kept = full_precision_params(module)
        self.copies: dict[int, torch.Tensor] = {
            i: torch.empty_like(p, dtype=policy.param_dtype) for i, p in self.masters.items()
            if p.is_floating_point() and p.dtype != policy.param_dtype and i not in kept}
        self._seen: dict[int, tuple] = {}                     # id(master) → (version, storage) copied last

    def refresh(self) -> None:
        """Copy each master whose value changed (optimizer step, broadcast, load) into its low-precision copy.
        Only then: a copy rewritten while a forward's graph is alive would fail its backward."""
        with torch.no_grad():
            for i, copy in self.copies.items():
                master = self.masters[i]
                now = (master._version, master.data_ptr())
                if self._seen.get(i) != now:
                    copy.copy_(master)
                    self._seen[i] = now

    def __call__(self, *args, **kwargs):
        self.refresh()
        grad = torch.is_grad_enabled()
        params = {}
        for i, master in self.masters.items():
            copy = self.copies.get(i)
            if copy is None:
                value = master
            elif grad and master.requires_grad:
                value = _LowPrecision.apply(master, copy)
            else:
                value = copy
            params.update({name: value for name in self.names[i]})
        args, kwargs = cast_floating((args, kwargs), self.policy.param_dtype)
        out = functional_call(self.module, params, args, kwargs)
        return cast_floating(out, self.policy.output_dtype)
