"""Ring reduce-scatter, all-gather and all-reduce, built only from point-to-point isend/irecv.

    %%torchrun -n 4                         (a notebook cell; notebooks/01_collectives.ipynb replays it)
    import torch; from partrain_edu import runtime; from partrain_edu.parallel.ring import ring_all_reduce
    ctx = runtime.init(); t = torch.full((10,), ctx.rank + 1.0)
    ring_all_reduce(t)                      # t is 1+2+3+4 = 10 everywhere, as after dist.all_reduce(t)

    python benchmarks/ddp_vs_torch.py       (also times it against dist.all_reduce)

What is split: a tensor of S bytes is cut into n chunks (one per rank; sizes differ by at most one element when
n does not divide its length). What moves: every step, each rank sends one chunk to its right neighbour and
receives one from its left neighbour, all n sends at once, so every link of the ring is busy (环形 All-Reduce).

- reduce-scatter, n−1 steps: rank r sends the partial sum it holds of chunk (r−s−1) mod n and adds the
  chunk (r−s−2) mod n it receives. After n−1 steps rank r holds chunk r summed over every rank.
- all-gather, n−1 steps: rank r forwards the finished chunk (r−s) mod n and stores chunk (r−s−1) mod n.
- all-reduce = reduce-scatter then all-gather.

Each rank sends every chunk but one in each phase, so an all-reduce sends 2(n−1)/n · S bytes per rank — the
bandwidth-optimal amount, independent of n for large n (Patarasuk & Yuan 2009, "Bandwidth optimal all-reduce
algorithms for clusters of workstations"). Libraries choose among several: NCCL picks ring, tree, NVLS or CollNet
by message size and topology (the ring is the large-message case), and Gloo has several all-reduce algorithms.
Gloo's own `reduce_scatter_tensor` is an all-reduce inside, so this file is where a CommTracer shows the true
ring traffic: one `isend` record per step.

Every function works in place on a contiguous tensor, over `group` (default: the whole world), and can append
one row per step to `log` (phase, step, which chunk was sent and received, a copy of the tensor) so a notebook
can replay the ring step by step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """(start, end) of each of the n chunks of a flat tensor of `numel` elements; the first numel % n chunks
    are one element longer (the split `torch.tensor_split` makes). A chunk may be empty when numel < n."""
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for k in range(n):
        end = start + base + (k < extra)
        bounds.append((start, end))
        start = end
    return bounds


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    if not tensor.is_contiguous():
        raise ValueError("ring collectives work in place on a contiguous tensor: pass tensor.contiguous()")
    return tensor.view(-1)


def ring_neighbours(group) -> tuple[int, int, int, int]:
    """(my rank in the group, group size, global rank of my right neighbour, of my left neighbour): whom a
    ring sends to and receives from (ring attention's K, V blocks too: context.py)."""
    me, n = dist.get_rank(group), dist.get_world_size(group)
    pg = group if group is not None else dist.group.WORLD
    right = dist.get_global_rank(pg, (me + 1) % n)
    left = dist.get_global_rank(pg, (me - 1) % n)
    return me, n, right, left


_ring = ring_neighbours   # the name the ring functions call it by (notebook 01 prints ring_reduce_scatter's source)


def _exchange(flat: torch.Tensor, send: tuple[int, int], recv: tuple[int, int], right: int, left: int,
              group) -> torch.Tensor:
    """Send flat[send] to the right neighbour while receiving a chunk of the size of flat[recv] from the left.
    Both sides know every chunk's size, so a rank skips an empty chunk and its neighbour does too."""
    incoming = torch.empty(recv[1] - recv[0], dtype=flat.dtype, device=flat.device)
    works = []
    if incoming.numel():
        works.append(dist.irecv(incoming, src=left, group=group))     # post the receive first: no deadlock
    if send[1] > send[0]:
        works.append(dist.isend(flat[send[0]:send[1]], dst=right, group=group))  # a view: no copy
    for work in works:
        work.wait()          # both done before the caller writes into `flat`: the sent view is never changed
    return incoming


def _record(log: list | None, phase: str, step: int, sent: int, received: int, flat: torch.Tensor) -> None:
    if log is not None:
        log.append({"phase": phase, "step": step, "sent_chunk": sent, "received_chunk": received,
                    "tensor": flat.detach().clone()})


def ring_reduce_scatter(tensor: torch.Tensor, group=None, log: list | None = None) -> torch.Tensor:
    """Sum `tensor` over the ranks of `group`, leaving on rank r only chunk r of the sum (the other chunks
    hold partial sums). Returns the view of chunk r. n−1 steps; each rank sends (n−1) chunks ≈ (n−1)/n · S."""
    flat = _flat(tensor)
    me, n, right, left = _ring(group)
    bounds = chunk_bounds(flat.numel(), n)
    for step in range(n - 1):
        send, recv = (me - step - 1) % n, (me - step - 2) % n
        incoming = _exchange(flat, bounds[send], bounds[recv], right, left, group)
        start, end = bounds[recv]
        flat[start:end] += incoming                  # the left neighbour's partial sum of chunk `recv`, plus mine
        _record(log, "reduce-scatter", step, send, recv, flat)
    start, end = bounds[me]
    return flat[start:end]


def ring_all_gather(tensor: torch.Tensor, group=None, log: list | None = None) -> torch.Tensor:
    """Fill every chunk of `tensor` from the rank that owns it: on entry rank r's chunk r is final, on exit
    every rank holds every chunk. n−1 steps; each rank sends (n−1) chunks ≈ (n−1)/n · S."""
    flat = _flat(tensor)
    me, n, right, left = _ring(group)
    bounds = chunk_bounds(flat.numel(), n)
    for step in range(n - 1):
        send, recv = (me - step) % n, (me - step - 1) % n
        incoming = _exchange(flat, bounds[send], bounds[recv], right, left, group)
        start, end = bounds[recv]
        flat[start:end] = incoming                   # a finished chunk: store it and pass it on next step
        _record(log, "all-gather", step, send, recv, flat)
    return tensor


def ring_all_reduce(tensor: torch.Tensor, group=None, log: list | None = None) -> torch.Tensor:
    """Sum `tensor` over the ranks of `group`, in place, result on every rank (what `dist.all_reduce` does).
    2(n−1) steps; each rank sends 2(n−1)/n · S bytes (exactly, when n divides the length)."""
    ring_reduce_scatter(tensor, group, log)
    return ring_all_gather(tensor, group, log)


def ring_bytes_sent_by(rank: int, numel: int, element_size: int, n: int) -> int:
    """Bytes group rank `rank` sends in `ring_all_reduce` of `numel` elements: every chunk except its own in
    the reduce-scatter and every chunk except chunk rank+1 in the all-gather — 2(n−1)/n · S when n divides
    the length, off by at most two elements otherwise."""
    if n == 1:
        return 0
    sizes = [end - start for start, end in chunk_bounds(numel, n)]
    return (2 * numel - sizes[rank % n] - sizes[(rank + 1) % n]) * element_size
