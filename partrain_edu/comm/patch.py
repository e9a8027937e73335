"""Wrapping torch.distributed's functions, in the one way the course does it (CommTracer, the call records, the
emulated links): in torch.distributed and in distributed_c10d, whose *_object helpers call its own globals."""
from __future__ import annotations

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def patch_collectives(names, wrap) -> list[tuple]:
    """Replace each of `names` in torch.distributed and distributed_c10d by `wrap(name, original)`, one wrapper per
    original function: dist.isend stays c10d.isend (P2POp checks `op in [isend, irecv]`). Returns the (module, name,
    original) triples `restore` puts back. Shared by CommTracer, the call records and the emulated links."""
    saved, wrappers = [], {}
    for module in (dist, c10d):
        for name in names:
            original = vars(module).get(name)
            if original is None:
                continue
            if original not in wrappers:
                wrappers[original] = wrap(name, original)
            saved.append((module, name, original))
            setattr(module, name, wrappers[original])
    return saved


def restore(saved: list[tuple]) -> None:
    for module, name, original in reversed(saved):
        setattr(module, name, original)
