"""Handed out by exercise 08 (a ZeRO-3 / FSDP unit): `gather` a unit's full flat parameters from every rank's
shard, and `views` of a flat tensor as the unit's weight and bias. Neither is the answer: deciding when to
gather, what to keep, when to let go and how to reduce the gradient is.

    full = gather(shard, group)                  # (n·s,) every shard of the group, in group-rank order
    W, b = views(full, [(d, d), (d,)])           # views: W and b keep `full` alive while they live
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist


def gather(shard: torch.Tensor, group=None) -> torch.Tensor:
    """A new (n·s,) tensor holding the (s,) `shard` of every rank of `group` (None: all ranks; n its size) in
    group-rank order: the unit's full flat parameters, padding included. One all-gather on `group`, (n−1)/n·(n·s·bytes)
    sent by each rank. Not differentiable: the result is a plain tensor, whatever `shard` requires."""
    full = torch.empty(dist.get_world_size(group) * shard.numel(), dtype=shard.dtype)
    dist.all_gather_into_tensor(full, shard.detach().contiguous(), group=group)
    return full


def views(flat: torch.Tensor, shapes: list[tuple[int, ...]]) -> list[torch.Tensor]:
    """Consecutive views of `flat` (from its start) with these shapes; what is left over is the padding."""
    need = sum(math.prod(shape) for shape in shapes)
    if need > flat.numel():
        raise ValueError(f"shapes {shapes} need {need} values, the flat tensor has {flat.numel()}")
    out, offset = [], 0
    for shape in shapes:
        out.append(flat[offset:offset + math.prod(shape)].view(shape))
        offset += math.prod(shape)
    return out
