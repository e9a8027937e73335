"""FSDP's unsharded view: every parameter gathered to read, one full state dict to save, or loaded into the shards.

    with fsdp.summon_full_params(): print(model.head.weight)     # gathered, read-only; every rank enters it
    sd = fsdp.state_dict(); fsdp.load_state_dict(sd)              # one process's `module.state_dict()` format

**Sent**: `summon_full_params` and `state_dict` all-gather every FlatShard in its own dtype, (n−1)/n·Ψ·bytes per
rank (collectives: every rank calls them); `load_state_dict` sends nothing: each rank keeps its chunk of every
parameter, copied in place so the pieces (and the optimizer's references to them) stay the same tensors.
**Format**: the wrapped module's own, parameters and buffers, a tied parameter under each of its names. The views
of the gathered buffers are registered as the module's parameters for the call (`fsdp_layout.registered`), so
nn.Module's state-dict code names, orders and loads them as in one process.
"""
from __future__ import annotations

import contextlib

import torch

from partrain_edu.parallel.fsdp_layout import registered


@contextlib.contextmanager
def summon_full_params(fsdp):
    """Every parameter of FullyShardedDataParallel `fsdp` gathered in its own dtype and readable on the module
    (no grad, read-only; a collective: every rank enters it). Yields id(shard) → its parameters' views."""
    with torch.no_grad():
        fulls = [(s, s.flat.all_gather()) for s in fsdp.shards()]
        try:
            yield {id(s): s.set_views(full) for s, full in fulls}
        finally:
            for s, _ in fulls:
                s.set_views(None)


def full_state_dict(fsdp, destination=None, prefix: str = ""):
    """The full, unsharded state dict (parameters and buffers) under the wrapped module's names: one process's
    `module.state_dict()`. A collective: every rank calls it."""
    with summon_full_params(fsdp) as fulls, registered(fsdp.shards(), fulls):
        return fsdp.module.state_dict(destination=destination, prefix=prefix)


def load_full_state_dict(fsdp, state_dict, strict: bool = True):
    """Load a full state dict (one process's format): keep this rank's chunk of every parameter. Local."""
    fulls, chunks = {}, []
    with torch.no_grad():
        for s in fsdp.shards():
            flat = s.flat
            full = torch.zeros(flat.padded, dtype=flat.data.dtype, device=flat.data.device)
            lo = flat.rank * flat.shard_numel
            chunk = full[lo:lo + flat.shard_numel]
            chunk.copy_(flat.data)                          # a parameter left out keeps its value
            fulls[id(s)], chunks = flat.views(full), chunks + [(flat.data, chunk)]
        with registered(fsdp.shards(), fulls):
            result = fsdp.module.load_state_dict(state_dict, strict=strict)
        for mine, loaded in chunks:
            mine.copy_(loaded)                              # in place: the pieces and the optimizer keep theirs
    return result
