"""Point-to-point messages between pipeline stages: activations forward, their gradients back.

    mail = Mailbox([Boundary((4, 24)), Boundary((4, 12))], microbatches=8)   # 3 virtual stages, 2 boundaries

**Communicated.** The boundary between virtual stage v and v+1 carries, per micro-batch, one activation forward
(v → v+1) and its gradient, same shape and dtype, backward (v+1 → v). Both sides know each boundary's shape up
front (measured once by `pipeline.infer_boundaries`, or declared and checked by `agree_on_shapes`), so a receiver
allocates its buffer before the message arrives and only the raw tensor goes over the wire: GPipe's and
PipeDream's "send/recv of fixed-shape tensors". Bytes per message: the boundary's numel × element size (a
transformer's (B/m)·T·H·4 in fp32, `theory.traffic`'s "pp" model).
Messages are tagged by (kind, micro-batch, receiving virtual stage): under interleaving two messages between the
same ranks may be received out of send order, and the tag matches each receive with its own send. Sends are
non-blocking (`isend`, kept alive until `flush`), receives block: a stage waits exactly where the schedule makes it
depend on another, and that wait is the bubble. `dist.isend/irecv` are looked up on the module: `CommTracer` sees them.
"""
from __future__ import annotations

import itertools
from typing import NamedTuple

import torch
import torch.distributed as dist

KIND_TAGS = {"F": 0, "B": 1}  # activation forward, gradient backward


class Boundary(NamedTuple):
    """What crosses one stage boundary per micro-batch: the activation's (and its gradient's) shape and dtype."""
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32


class Mailbox:
    """Tagged, fixed-shape sends and receives between the ranks of one pipeline (explicit group): `boundaries[v]`
    is what virtual stage v sends to v + 1, so there are len(boundaries) + 1 virtual stages."""

    def __init__(self, boundaries: list[Boundary], microbatches: int, group=None,
                 device: torch.device | str = "cpu"):
        self.boundaries = [Boundary(tuple(b.shape), b.dtype) for b in boundaries]
        self.device, self.group = device, group
        self.m, self.vs = microbatches, len(self.boundaries) + 1
        self.pending: list[tuple[dist.Work, torch.Tensor]] = []  # sends in flight, tensors kept alive

    def tag(self, kind: str, microbatch: int, to_virtual: int) -> int:
        return (KIND_TAGS[kind] * self.m + microbatch) * self.vs + to_virtual

    def boundary(self, kind: str, to_virtual: int) -> Boundary:
        """An activation goes to v from boundary v − 1; a gradient goes back to v across boundary v."""
        return self.boundaries[to_virtual - 1 if kind == "F" else to_virtual]

    def send(self, tensor: torch.Tensor, to_rank: int, kind: str, microbatch: int, to_virtual: int) -> None:
        shape, dtype = self.boundary(kind, to_virtual)
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"stage output {tuple(tensor.shape)} {tensor.dtype} does not match the agreed {shape} "
                             f"{dtype} of its boundary; every micro-batch must have the size the shapes were found for")
        tensor = tensor.detach().contiguous()
        work = dist.isend(tensor, dst=to_rank, group=self.group, tag=self.tag(kind, microbatch, to_virtual))
        self.pending.append((work, tensor))

    def recv(self, from_rank: int, kind: str, microbatch: int, to_virtual: int) -> torch.Tensor:
        shape, dtype = self.boundary(kind, to_virtual)
        buffer = torch.empty(shape, dtype=dtype, device=self.device)  # e.g. (B/m, T, H)
        dist.irecv(buffer, src=from_rank, group=self.group, tag=self.tag(kind, microbatch, to_virtual)).wait()
        return buffer

    def flush(self) -> None:
        """Wait for every send of this step (their receivers have them once the step ends)."""
        for work, _ in self.pending:
            work.wait()
        self.pending.clear()


def agree_on_shapes(mine: dict, group=None) -> list[dict]:
    """For a pipeline that declares one boundary shape for all (the 3d strategy's (B/dp/m, T, H)): every rank
    states its part (layers held, that shape); all must agree before the first message, else a one-line
    ValueError on every rank (rather than a hang or a garbled receive)."""
    everyone: list[dict] = [{} for _ in range(dist.get_world_size(group))]
    dist.all_gather_object(everyone, mine, group=group)
    shapes = {tuple(d["shape"]) for d in everyone}
    if len(shapes) != 1:
        raise ValueError(f"pipeline stages disagree on the boundary shape {sorted(shapes)}; give every rank the "
                         "same global batch, number of micro-batches and model config")
    layers = sorted(r for d in everyone for r in d["layers"])
    for (_, a1), (b0, _) in itertools.pairwise(layers):
        if a1 != b0:
            raise ValueError(f"pipeline stages hold layers {layers}, which do not join up; give boundaries that "
                             "cover every layer once, in order")
    return everyone
