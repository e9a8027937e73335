"""Handed out by exercise 12 (ring attention): one differentiable step of the ring.

`pass_to_next(tensor, group)` sends `tensor` to the next rank of `group` (r + 1) and returns the block received
from the previous one (r − 1), with isend/irecv. Its backward sends the incoming gradient the other way (to r − 1,
from r + 1), so autograd carries each dK, dV contribution back, hop by hop, to the rank that owns that block — the
learner writes the forward pass of ring attention (Liu et al. 2023) and gets exact gradients without writing
its backward. Every rank must call it the same number of times, and every call's output must reach the loss on
every rank (autograd runs a node's backward, and so its messages, only where its output was used).

While the check grades (`watching`), each call also notes itself on its autograd node, so the check can tell,
before any backward, whether a rank left a pass out of its loss (its neighbours would wait forever), and a call
on another group than the one the graded function was handed fails at once instead of waiting on a rank that
is not in the ring.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

_watch: dict | None = None   # while the check grades: {"group": the group handed out, "calls": passes so far}


def _shift(tensor: torch.Tensor, step: int, group) -> torch.Tensor:
    """The `tensor` of rank r − step (received) after sending ours to rank r + step, within `group`."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    if n == 1:
        return tensor.clone()
    dst, src = (me + step) % n, (me - step) % n
    if group is not None:  # isend/irecv name peers by global rank
        dst, src = dist.get_global_rank(group, dst), dist.get_global_rank(group, src)
    received = torch.empty_like(tensor, memory_format=torch.contiguous_format)
    # Post both before waiting: if every rank first waited to receive, nobody would send.
    works = [dist.irecv(received, src=src, group=group), dist.isend(tensor.contiguous(), dst=dst, group=group)]
    for work in works:
        work.wait()
    return received


class _PassToNext(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        ctx.group = group
        return _shift(tensor.detach(), +1, group)

    @staticmethod
    def backward(ctx, grad):
        # y_{r+1} = x_r, so dL/dx_r = dL/dy_{r+1}: the gradient travels back to the rank that sent the block.
        return _shift(grad, -1, ctx.group), None


def pass_to_next(tensor: torch.Tensor, group=None) -> torch.Tensor:
    """Send `tensor` to rank r + 1 and return the one rank r − 1 sent (same shape and dtype); differentiable:
    the gradient of the result goes back to rank r − 1's `tensor`."""
    if _watch is not None and not _same(group, _watch["group"]):
        ranks = "the default group" if _watch["group"] is None else \
            f"the group of global ranks {dist.get_process_group_ranks(_watch['group'])}"
        raise ValueError(f"pass_to_next(tensor, group={group!r}) while ring_attention was handed {ranks}: pass "
                         "the function's own `group` on (on another group the ring would wait on ranks outside it)")
    received = _PassToNext.apply(tensor, group)
    if _watch is not None and received.grad_fn is not None:
        received.grad_fn.ring_call = len(_watch["calls"])  # found again by walking the output's graph
        _watch["calls"].append(received.grad_fn)
    return received


def _same(group, handed) -> bool:
    world = (None, dist.group.WORLD)
    return group in world if handed in world else group is handed


@contextlib.contextmanager
def watching(group):
    """(For the check.) Within: refuse passes on another group than `group`, and list the passes made (their
    autograd nodes, each with `ring_call`, its index)."""
    global _watch
    _watch = {"group": group, "calls": []}
    try:
        yield _watch["calls"]
    finally:
        _watch = None
