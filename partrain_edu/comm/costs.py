"""What one ``torch.distributed`` call sends and receives, under the ring cost model: one rule per op.

``COSTS[op](bound arguments, group)`` gives (payload S, bytes this rank sends, bytes it receives, peer or root).
With n = group size, the ring rules are `theory.traffic.ring_bytes_sent`'s (bytes rounded up):

    all_reduce                 2(n-1)/n * S  a reduce-scatter then an all-gather around a ring, each moving n-1
                                             chunks of S/n: bandwidth-optimal (Patarasuk & Yuan 2009); the
                                             factor NCCL uses for "bus bandwidth" (nccl-tests PERFORMANCE.md)
    all_gather, reduce_scatter  (n-1)/n * S  S is the FULL tensor: all_gather_into_tensor's output,
                                             reduce_scatter_tensor's input, the sum of a list variant's list
    reduce                      (n-1)/n * S
    broadcast                         S      pipelined ring: every rank forwards it (we count S on every
                                             rank, the last one included; 0 when n = 1)
    all_to_all      the bytes of this rank's input that go to other ranks ((n-1)/n * S for even splits)
    send, isend                       S      recv, irecv send 0 and receive S
    gather, scatter    a non-root sends its chunk to the root; the root sends every other rank's chunk
    barrier                           0

Used by the tracer (`comm.CommTracer`), the call records and the emulated links (`emulated.links`).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from partrain_edu.theory.traffic import ring_bytes_sent


class Group(NamedTuple):
    n: int                       # group size
    me: int                      # this rank's rank in the group
    rank: int                    # this rank's global rank
    ranks: tuple[int, ...]       # global ranks, in group-rank order


def size(x) -> int:
    """Bytes of a tensor, or of a (nested) list of tensors."""
    return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else sum(map(size, x or ()))


def peer(g: Group, rank: int | None, group_rank: int | None) -> int | None:
    """Global rank of a peer or root given either way torch accepts it (global ``dst`` or ``group_dst``)."""
    return g.ranks[group_rank] if rank is None and group_rank is not None else rank


def _ring(arg: str, shape: str):
    """Cost of a ring collective on the full tensor(s) in argument ``arg``, priced as theory's ``shape``
    (all_reduce: 2(n-1)/n * S; all_gather: (n-1)/n * S) each way."""
    def cost(a, g):
        S = size(a[arg])
        moved = ring_bytes_sent(shape, S, g.n)
        return S, moved, moved, peer(g, a.get("dst"), a.get("group_dst"))   # reduce has a root
    return cost


def _away(t: torch.Tensor, splits, g: Group) -> int:
    """Bytes of ``t`` (split along dim 0 by ``splits``) that go to, or come from, the other ranks."""
    S = size(t)
    return (g.n - 1) * S // g.n if not splits else S - splits[g.me] * (S // max(t.shape[0], 1))


def _all_to_all(a, g):
    ins, outs = a["input_tensor_list"], a["output_tensor_list"]
    return size(ins), size(ins) - size(ins[g.me]), size(outs) - size(outs[g.me]), None


def _broadcast(a, g):
    S, root = size(a["tensor"]), peer(g, a["src"], a["group_src"])
    return S, ring_bytes_sent("broadcast", S, g.n), 0 if root == g.rank else S, root


def _send(a, g):
    return size(a["tensor"]), size(a["tensor"]), 0, peer(g, a["dst"], a["group_dst"])


def _recv(a, g):  # src=None (receive from any rank) leaves the peer unknown
    return size(a["tensor"]), 0, size(a["tensor"]), peer(g, a["src"], a["group_src"])


def _gather(a, g):
    S, root = size(a["tensor"]), peer(g, a["dst"], a["group_dst"])
    return (S, 0, size(a["gather_list"]) - S, root) if root == g.rank else (S, S, 0, root)


def _scatter(a, g):
    S, root = size(a["tensor"]), peer(g, a["src"], a["group_src"])
    return (S, size(a["scatter_list"]) - S, 0, root) if root == g.rank else (S, 0, S, root)


# theory.traffic's ring shapes
AR = "all_reduce"
AG = "all_gather"
RS = "reduce_scatter"
# op name -> cost(bound arguments, group) -> (payload S, sent, received, peer)
COSTS = {
    "all_reduce": _ring("tensor", AR), "all_reduce_coalesced": _ring("tensors", AR),
    "all_gather": _ring("tensor_list", AG), "all_gather_coalesced": _ring("output_tensor_lists", AG),
    "all_gather_into_tensor": _ring("output_tensor", AG), "all_gather_single": _ring("output_tensor", AG),
    "_all_gather_base": _ring("output_tensor", AG),
    "reduce_scatter": _ring("input_list", RS), "reduce_scatter_tensor": _ring("input", RS),
    "reduce_scatter_single": _ring("input", RS), "_reduce_scatter_base": _ring("input", RS),
    "reduce": _ring("tensor", RS),   # a reduce-scatter whose pieces all go to the root: (n-1)/n * S
    "broadcast": _broadcast,
    "all_to_all": _all_to_all,
    "all_to_all_single": lambda a, g: (size(a["input"]), _away(a["input"], a["input_split_sizes"], g),
                                       _away(a["output"], a["output_split_sizes"], g), None),
    "send": _send, "isend": _send, "recv": _recv, "irecv": _recv,
    "gather": _gather, "scatter": _scatter,
    "barrier": lambda a, g: (0, 0, 0, None), "monitored_barrier": lambda a, g: (0, 0, 0, None),
}


def group_of(group) -> Group | None:
    """The group a call runs on, or None where torch does nothing (or raises): no process group yet, or
    this rank is not a member."""
    if not dist.is_initialized() or c10d._rank_not_in_group(group):
        return None
    pg = group if group is not None else dist.group.WORLD
    ranks = tuple(dist.get_process_group_ranks(pg))
    return Group(len(ranks), dist.get_rank(pg), dist.get_rank(), ranks)
