"""Gradient clipping when each rank holds part of the gradient: one all-reduce of the squared shard norms.

    opt.clip_grad_norm_(1.0)       fsdp.clip_grad_norm_(1.0)       clip_grad_norm_tp(model, 1.0, region)

`torch.nn.utils.clip_grad_norm_` takes ‖g‖ of the `.grad` it is handed. Under ZeroOptimizer stage 1 those are
this rank's own gradients, not yet averaged (step() averages them); stage 2 has dropped them; FSDP holds pieces,
tensor parallelism slices. Each rank would clip by its own norm, silently. So the wrappers hand such gradients
out as `LocalGrad`: any norm of one (clip_grad_norm_, get_total_norm, .norm()) raises a one-line error naming
the method to call; every other op runs as on a plain tensor.
The global norm: the pieces partition the gradient, so ‖g‖₂² = Σ_ranks Σ_pieces ‖g_piece‖² — one all-reduce of
one number per rank (∞-norm: a MAX all-reduce; p-norm: of Σ|g|ᵖ); then every piece is multiplied by torch's
coefficient min(1, max_norm / (‖g‖ + 1e-6)). Tensor parallelism: a split weight's slices partition it (summed
over the tp ranks); a replicated weight's gradient is the same on every tp rank (f and g make it so), so each
rank adds ‖g‖ᵖ/t of it: counted once, not t times.
"""
from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn

# What the wrappers say when a norm of one of their gradients is asked for.
ZERO_STAGE1 = ("this is one rank's gradient, not yet averaged (ZeroOptimizer averages inside step()): clip with "
               "opt.clip_grad_norm_(max_norm), not torch.nn.utils.clip_grad_norm_")
ZERO_STAGE2 = ("ZeroOptimizer stage 2 dropped this full gradient after reduce-scattering it (this rank keeps its "
               "chunk: opt.gradient_shards()): clip with opt.clip_grad_norm_(max_norm)")
FSDP = ("this is this rank's piece of the gradient (FullyShardedDataParallel shards it): clip with "
        "fsdp.clip_grad_norm_(max_norm), not torch.nn.utils.clip_grad_norm_")
TENSOR_PARALLEL = ("this is this rank's slice of a tensor-parallel weight's gradient: clip with "
                   "partrain_edu.parallel.clipping.clip_grad_norm_tp(model, max_norm, region)")

NORMS = {torch._foreach_norm, torch.linalg.vector_norm, torch.linalg.norm, torch.linalg.matrix_norm, torch.norm,
         torch.Tensor.norm}
ALWAYS_ALLOWED = {torch.Tensor.__repr__, torch.Tensor.__format__, torch.Tensor.shape.__get__,
                  torch.Tensor.dtype.__get__, torch.Tensor.device.__get__, torch.Tensor.size, torch.Tensor.dim}


class LocalGrad(torch.Tensor):
    """A gradient that is only this rank's part of the one a single process would have. Norms are refused with
    `refusal`; `placeholder` ones (ZeRO-2's dropped gradients: zeros with stride 0, no memory) refuse any op."""

    refusal: str = FSDP
    placeholder: bool = False

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in NORMS or (func not in ALWAYS_ALLOWED and _any_placeholder(args, kwargs)):
            refusal = next((a.refusal for a in _tensors(args, kwargs) if isinstance(a, LocalGrad)), cls.refusal)
            raise RuntimeError(f"{getattr(func, '__name__', func)} of a gradient: {refusal}")
        with torch._C.DisableTorchFunctionSubclass():           # a plain op, plain results
            return func(*args, **(kwargs or {}))


def _tensors(args, kwargs):
    for a in (*args, *(kwargs or {}).values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _any_placeholder(args, kwargs) -> bool:
    return any(isinstance(a, LocalGrad) and a.placeholder for a in _tensors(args, kwargs))


def mark(grad: torch.Tensor, refusal: str) -> LocalGrad:
    """`grad` as a LocalGrad: the same storage, norms refused with `refusal`."""
    if isinstance(grad, LocalGrad):
        return grad
    with torch._C.DisableTorchFunctionSubclass():
        out = grad.as_subclass(LocalGrad)
    out.refusal = refusal
    return out


def placeholder(param: torch.Tensor, refusal: str) -> LocalGrad:
    """Where a dropped gradient was: zeros of `param`'s shape in one element (stride 0); any use is refused."""
    out = mark(torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape), refusal)
    out.placeholder = True
    return out


def is_placeholder(grad) -> bool:
    return isinstance(grad, LocalGrad) and grad.placeholder


def plain(t: torch.Tensor) -> torch.Tensor:
    """The tensor itself as a plain torch.Tensor (same storage): what the wrappers compute norms with."""
    if not isinstance(t, LocalGrad):
        return t
    with torch._C.DisableTorchFunctionSubclass():
        return t.as_subclass(torch.Tensor)


def mark_on_accumulate(param: nn.Parameter, refusal: str):
    """From now on `param.grad` is a LocalGrad after each backward (a hook after autograd accumulates it)."""
    def hook(p):
        if p.grad is not None and not isinstance(p.grad, LocalGrad):
            p.grad = mark(p.grad, refusal)
    return param.register_post_accumulate_grad_hook(hook)


def local_power(grads: Iterable[torch.Tensor], norm_type: float, device=None) -> torch.Tensor:
    """Σ|g|ᵖ over `grads` (∞: max |g|), a float32 scalar on `device`: this rank's share of ‖g‖ᵖ."""
    grads = [plain(g).detach() for g in grads]
    total = torch.zeros((), dtype=torch.float32, device=device or (grads[0].device if grads else None))
    for g in grads:
        if g.numel():
            g = g.float().abs()
            total = torch.maximum(total, g.max()) if math.isinf(norm_type) else total + g.pow(norm_type).sum()
    return total


def global_norm(power: torch.Tensor, norm_type: float, group=None) -> torch.Tensor:
    """‖g‖ from each rank's share (`local_power`): one all-reduce (sum; max for ∞) over `group`."""
    dist.all_reduce(power, op=dist.ReduceOp.MAX if math.isinf(norm_type) else dist.ReduceOp.SUM, group=group)
    return power if math.isinf(norm_type) else power.pow(1.0 / norm_type)


def scale_(grads: Iterable[torch.Tensor], max_norm: float, total: torch.Tensor,
           error_if_nonfinite: bool = False) -> torch.Tensor:
    """Multiply every gradient by torch's coefficient min(1, max_norm / (total + 1e-6)); returns `total`."""
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(f"the total norm of the gradients is {float(total)}: pass error_if_nonfinite=False "
                           "to clip anyway")
    coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for g in grads:
            g = plain(g)
            g.mul_(coef.to(g.device, g.dtype))
    return total


def clip_shards_(grads: list[torch.Tensor], max_norm: float, norm_type: float = 2.0, group=None,
                 error_if_nonfinite: bool = False, device=None) -> torch.Tensor:
    """Clip gradients that partition the global one across `group` (shards, pieces): its true norm, returned."""
    norm_type = float(norm_type)
    total = global_norm(local_power(grads, norm_type, device), norm_type, group)
    return scale_(grads, max_norm, total, error_if_nonfinite)


def clip_grad_norm_tp(module: nn.Module, max_norm: float, region, norm_type: float = 2.0,
                      error_if_nonfinite: bool = False) -> torch.Tensor:
    """`torch.nn.utils.clip_grad_norm_(module.parameters(), max_norm)` for a module split by `parallelize`:
    a split weight (`tp_split_dim`) counted once over its slices, a replicated one once, not t times.
    `region`: the region or group it was split over. Under sequence parallelism call it after
    `region.finish_grads(module)` (the replicated gradients are whole only then)."""
    group = getattr(region, "group", region)
    norm_type, t = float(norm_type), dist.get_world_size(group)
    params = [p for p in module.parameters() if p.grad is not None]
    split = [p.grad for p in params if getattr(p, "tp_split_dim", None) is not None]
    whole = [p.grad for p in params if getattr(p, "tp_split_dim", None) is None]
    device = params[0].device if params else None
    power, mine = local_power(split, norm_type, device), local_power(whole, norm_type, device)
    power = torch.maximum(power, mine) if math.isinf(norm_type) else power + mine / t
    total = global_norm(power, norm_type, group)
    return scale_(split + whole, max_norm, total, error_if_nonfinite)
