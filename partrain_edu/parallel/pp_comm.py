"""Point-to-point messages between pipeline stages: activations forward, their gradients back.

    partrain-edu train --strategy pp-1f1b --nproc 4 --pp 4 --microbatches 8 --json

**Communicated.** A boundary between virtual stage u and u+1 carries, per micro-batch, one activation
(B/m, T, H) forward (u → u+1) and its gradient, same shape, backward (u+1 → u). Both sides know that shape up
front (from the config; checked once by :func:`agree_on_shapes`), so a receiver allocates its buffer before
the message arrives and nothing but the raw tensor goes over the wire — GPipe's and PipeDream's "send/recv of
fixed-shape tensors". Bytes per message: (B/m)·T·H·4 in fp32, `theory.traffic`'s "pp" model.

Messages are tagged by (kind, micro-batch, receiving virtual stage): with interleaved schedules two messages
between the same pair of ranks may be received in another order than they were sent (chunk 0's activation
and chunk 1's gradient), and the tag lets Gloo match each receive with its own send. Sends are non-blocking
(``isend``; the tensor is kept alive until :meth:`Mailbox.flush` waits for them), receives block — so a
stage waits exactly where the schedule makes it depend on another stage, and that wait is the bubble.
They go through ``torch.distributed.isend/irecv``, so ``CommTracer`` counts every byte.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

KIND_TAGS = {"F": 0, "B": 1}  # activation forward, gradient backward


class Mailbox:
    """Tagged, fixed-shape sends and receives between the ranks of one pipeline (explicit group)."""

    def __init__(self, shape: tuple[int, ...], microbatches: int, virtual_stages: int, group=None,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.shape, self.dtype, self.device, self.group = tuple(shape), dtype, device, group
        self.m, self.vs = microbatches, virtual_stages
        self.pending: list[tuple[dist.Work, torch.Tensor]] = []  # sends in flight, tensors kept alive

    def tag(self, kind: str, microbatch: int, to_virtual: int) -> int:
        return (KIND_TAGS[kind] * self.m + microbatch) * self.vs + to_virtual

    def send(self, tensor: torch.Tensor, to_rank: int, kind: str, microbatch: int, to_virtual: int) -> None:
        if tuple(tensor.shape) != self.shape or tensor.dtype != self.dtype:
            raise ValueError(f"stage output {tuple(tensor.shape)} {tensor.dtype} does not match the agreed "
                             f"{self.shape} {self.dtype}; every stage must map (B/m, T, H) to (B/m, T, H)")
        tensor = tensor.detach().contiguous()
        work = dist.isend(tensor, dst=to_rank, group=self.group, tag=self.tag(kind, microbatch, to_virtual))
        self.pending.append((work, tensor))

    def recv(self, from_rank: int, kind: str, microbatch: int, to_virtual: int) -> torch.Tensor:
        buffer = torch.empty(self.shape, dtype=self.dtype, device=self.device)  # (B/m, T, H)
        dist.irecv(buffer, src=from_rank, group=self.group, tag=self.tag(kind, microbatch, to_virtual)).wait()
        return buffer

    def flush(self) -> None:
        """Wait for every send of this step (their receivers have them once the step ends)."""
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def agree_on_shapes(mine: dict, group=None) -> list[dict]:
    """Every rank states its part of the pipeline (layers held, boundary shape); all must agree before the
    first message, else a one-line ValueError on every rank (rather than a hang or a garbled receive)."""
    everyone: list[dict] = [{} for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(everyone, mine, group=group)
    shapes = {tuple(d["shape"]) for d in everyone}
    if len(shapes) != 1:
        raise ValueError(f"pipeline stages disagree on the boundary shape {sorted(shapes)}; give every rank the "
                         "same --global-batch, --microbatches and model config")
    layers = sorted(r for d in everyone for r in d["layers"])
    for (a0, a1), (b0, _) in zip(layers, layers[1:]):
        if a1 != b0:
            raise ValueError(f"pipeline stages hold layers {layers}, which do not join up; give boundaries that "
                             "cover every layer once, in order")
    return everyone
