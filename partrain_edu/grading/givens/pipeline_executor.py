"""Point-to-point helpers between neighbouring pipeline stages, for exercise 11 (a 1F1B executor).

Stage s is rank s of `group` (the world when None); it talks only to s − 1 and s + 1. Activations go forward
(s → s + 1), their gradients go backward (s + 1 → s); both have the shape `shape` the caller gives, so the
receiver allocates its buffer before the message arrives (Megatron-LM's p2p_communication does the same).

Sends and receives are *blocking*: a send returns only once the neighbour posts the matching receive (Gloo's
do; NCCL's hold up the GPU's stream the same way). So in 1F1B's steady phase — stage s sends an activation to
s + 1 while s + 1 sends a gradient back to s — two separate blocking sends wait for each other for ever. The
combined `send_forward_recv_backward` / `send_backward_recv_forward` post the send and the receive together
and wait on both (Narayanan et al. 2021; Megatron-LM's schedules.py uses exactly these two).

At the ends of the pipeline the helpers do nothing, so every stage can run the same loop: on the first stage
`recv_forward`, `send_backward_recv_forward` return None (it reads its own micro-batches), `send_backward` sends
nothing; on the last, `send_forward` sends nothing, `recv_backward`, `send_forward_recv_backward` return None.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["recv_forward", "send_forward", "recv_backward", "send_backward", "send_forward_recv_backward",
           "send_backward_recv_forward"]


def _neighbour(offset: int, group) -> int | None:
    """The global rank of stage (this stage + offset) in `group`, or None past either end of the pipeline."""
    stage, stages = dist.get_rank(group), dist.get_world_size(group)
    other = stage + offset
    if not 0 <= other < stages:
        return None
    return dist.get_global_rank(group, other) if group is not None else other


def _outgoing(tensor, what: str) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        hint = (" — the gradient of the received input is in its .grad only if you called requires_grad_() on "
                "it before the forward" if what == "gradient" else "")
        raise TypeError(f"the {what} to send must be a tensor, got {type(tensor).__name__}{hint}")
    return tensor.detach().contiguous()  # only the values travel: autograd's graph stays on this stage


def _buffer(shape) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=torch.float32)


def recv_forward(shape, group=None) -> torch.Tensor | None:
    """The activation stage s − 1 sends next (a fresh tensor of `shape`); None on the first stage."""
    prev = _neighbour(-1, group)
    if prev is None:
        return None
    buffer = _buffer(shape)
    dist.recv(buffer, src=prev, group=group)  # src, dst: global ranks (as CommTracer records peers)
    return buffer


def send_forward(output, group=None) -> None:
    """Send this stage's output to stage s + 1 (blocks until it receives it); nothing on the last stage."""
    nxt = _neighbour(+1, group)
    if nxt is not None:
        dist.send(_outgoing(output, "activation"), dst=nxt, group=group)


def recv_backward(shape, group=None) -> torch.Tensor | None:
    """dL/d(output) that stage s + 1 sends next (a fresh tensor of `shape`); None on the last stage."""
    nxt = _neighbour(+1, group)
    if nxt is None:
        return None
    buffer = _buffer(shape)
    dist.recv(buffer, src=nxt, group=group)
    return buffer


def send_backward(input_grad, group=None) -> None:
    """Send dL/d(input) to stage s − 1 (blocks until it receives it); nothing on the first stage."""
    prev = _neighbour(-1, group)
    if prev is not None:
        dist.send(_outgoing(input_grad, "gradient"), dst=prev, group=group)


def _exchange(tensor, what: str, peer: int, shape, group) -> torch.Tensor:
    """Send `tensor` to `peer` while receiving a tensor of `shape` from it: both posted, then both waited on."""
    outgoing, incoming = _outgoing(tensor, what), _buffer(shape)
    works = [dist.isend(outgoing, dst=peer, group=group), dist.irecv(incoming, src=peer, group=group)]
    for work in works:
        work.wait()
    return incoming


def send_forward_recv_backward(output, shape, group=None) -> torch.Tensor | None:
    """Send this stage's output to s + 1 and receive from it the gradient of the oldest output it has not
    answered yet: posted together, so s + 1 may be sending that gradient at the same moment. None on the last
    stage (nothing is sent)."""
    nxt = _neighbour(+1, group)
    return None if nxt is None else _exchange(output, "activation", nxt, shape, group)


def send_backward_recv_forward(input_grad, shape, group=None) -> torch.Tensor | None:
    """Send dL/d(input) to s − 1 and receive from it the next activation: posted together, so s − 1 may be
    sending that activation at the same moment. None on the first stage (nothing is sent)."""
    prev = _neighbour(-1, group)
    return None if prev is None else _exchange(input_grad, "gradient", prev, shape, group)
