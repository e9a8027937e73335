"""Every byte tensor parallelism moves: Megatron's conjugate operators f and g, and their sequence-parallel pair.

The math of tensor parallelism (which slice of which matrix a rank holds) lives in `tensor.py`; the only places
its ranks meet are the five autograd functions below. They call `torch.distributed` by attribute
(`dist.all_reduce`, never a bound import), so a `CommTracer` sees and counts every call.

Tensor parallelism (Shoeybi et al. 2019, "Megatron-LM", §3, Figure 3):

    f   copy_to_tensor_parallel       forward: identity         backward: all-reduce the gradient
    g   reduce_from_tensor_parallel   forward: all-reduce       backward: identity

f opens a tensor-parallel region (every rank needs the whole input X to multiply by its column slice, and the
gradient of X is the sum of every rank's contribution); g closes it (the row-parallel partial products sum to Y).
f and g are *conjugate*: each is the other's transpose, so forward and backward move the same bytes.

Sequence parallelism (Korthikanti et al. 2022, §4.2.2, Figure 5 — their "g" and "ḡ"): outside the tensor-parallel
region the activations are split along the sequence, (B, T/t, H), and

    gather_from_sequence          forward: all-gather          backward: reduce-scatter      (Korthikanti's g)
    reduce_scatter_to_sequence    forward: reduce-scatter      backward: all-gather          (Korthikanti's ḡ)

Under the ring model an all-gather plus a reduce-scatter of S bytes send (t−1)/t·S + (t−1)/t·S = 2(t−1)/t·S,
exactly one all-reduce: sequence parallelism costs no extra bandwidth, it only changes *which* collectives run.
`all_gather_sequence` is also used alone, to re-gather a saved shard in backward (see sequence.py).

Shapes: activations are (B, T, H) with the sequence on dim 1. Collectives concatenate along dim 0, so the
sequence helpers move it to the front, (T, B, H), where each rank's block of positions is contiguous.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _size(group) -> int:
    return dist.get_world_size(group)


def all_reduce_(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Sum (or max) `tensor` over the group, in place; returned for chaining."""
    dist.all_reduce(tensor, op=op, group=group)
    return tensor


def all_gather_sequence(shard: torch.Tensor, group) -> torch.Tensor:
    """(B, T/t, H) on each rank → (B, T, H) on every rank, rank r's positions at [r·T/t, (r+1)·T/t)."""
    seq_first = shard.transpose(0, 1).contiguous()                      # (T/t, B, H)
    full = seq_first.new_empty((_size(group) * seq_first.shape[0], *seq_first.shape[1:]))  # (T, B, H)
    dist.all_gather_single(full, seq_first, group=group)
    return full.transpose(0, 1).contiguous()                            # (B, T, H)


def reduce_scatter_sequence(full: torch.Tensor, group) -> torch.Tensor:
    """(B, T, H) partial sums on each rank → (B, T/t, H): the sum over ranks of this rank's positions."""
    seq_first = full.transpose(0, 1).contiguous()                       # (T, B, H)
    if seq_first.shape[0] % _size(group):
        raise ValueError(f"sequence length {seq_first.shape[0]} is not divisible by the {_size(group)} "
                         "tensor-parallel ranks; pick a seq_len that is a multiple of tp")
    shard = seq_first.new_empty((seq_first.shape[0] // _size(group), *seq_first.shape[1:]))  # (T/t, B, H)
    dist.reduce_scatter_single(shard, seq_first, group=group)
    return shard.transpose(0, 1).contiguous()                           # (B, T/t, H)


class _CopyToTensorParallel(torch.autograd.Function):
    """f: identity forward; backward all-reduces dL/dX, since every rank's slice of the layer used all of X."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # all_reduce works in place: reduce a copy, never a buffer autograd handed us.
        return all_reduce_(grad.clone(memory_format=torch.contiguous_format), ctx.group), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """g: all-reduce forward (sum the row-parallel partial products); identity backward (each rank's partial
    product contributed to Y with weight 1, so each receives dL/dY unchanged)."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce_(x.clone(memory_format=torch.contiguous_format), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromSequence(torch.autograd.Function):
    """Korthikanti's g: all-gather the sequence shards forward; the gradient of a gathered tensor is the sum
    over ranks of their gradients, of which each rank keeps its own positions: a reduce-scatter."""

    @staticmethod
    def forward(ctx, shard, group):
        ctx.group = group
        return all_gather_sequence(shard, group)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_sequence(grad, ctx.group), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Korthikanti's ḡ: reduce-scatter forward (sum partial products, keep this rank's positions); backward
    all-gathers, since every rank's partial product fed every position."""

    @staticmethod
    def forward(ctx, full, group):
        ctx.group = group
        return reduce_scatter_sequence(full, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_sequence(grad, ctx.group), None


def copy_to_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    """f (Megatron): (…, H) → (…, H), all-reduce in backward."""
    return _CopyToTensorParallel.apply(x, group)


def reduce_from_tensor_parallel(x: torch.Tensor, group) -> torch.Tensor:
    """g (Megatron): (…, H) partial sums → (…, H) summed, identity in backward."""
    return _ReduceFromTensorParallel.apply(x, group)


def gather_from_sequence(shard: torch.Tensor, group) -> torch.Tensor:
    """g (Korthikanti): (B, T/t, H) → (B, T, H), reduce-scatter in backward."""
    return _GatherFromSequence.apply(shard, group)


def reduce_scatter_to_sequence(full: torch.Tensor, group) -> torch.Tensor:
    """ḡ (Korthikanti): (B, T, H) partial sums → (B, T/t, H), all-gather in backward."""
    return _ReduceScatterToSequence.apply(full, group)
