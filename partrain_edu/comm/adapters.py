"""Make the communication of DTensor and FSDP2 visible to `CommTracer`, priced by the same ring cost model.

`CommTracer` wraps the Python functions of `torch.distributed`. Two kinds of traffic never pass through them:
PyTorch DDP's bucket all-reduce, launched by its C++ reducer (`comm.ddp_hook`), and functional collectives
(`torch.ops._c10d_functional`, what DTensor and FSDP2 use). `FunctionalCollectiveCounter` is a `CommDebugMode`
(a TorchDispatchMode that sees them, forward and backward) that also prices each call — payload S is the full
tensor: the input of an all-reduce or reduce-scatter, group size × the input of an all-gather — and adds
one `CommRecord` to the active tracer, labelled "forward" or "backward".
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.tensor.debug import CommDebugMode  # ~2 s of imports (DTensor, dynamo): a module of its own

from partrain_edu.comm.tracer import CommRecord, CommTracer
from partrain_edu.theory.traffic import ring_bytes_sent

_FUNCOL = torch.ops._c10d_functional
# functional op → (our op name, ring-model op, payload S in bytes, group name) from its arguments
_COLLECTIVES = {
    _FUNCOL.all_reduce: ("all_reduce", "all_reduce", lambda a: _nbytes(a[0]), lambda a: a[2]),
    _FUNCOL.all_gather_into_tensor: ("all_gather_into_tensor", "all_gather", lambda a: _nbytes(a[0]) * a[1],
                                     lambda a: a[2]),
    _FUNCOL.reduce_scatter_tensor: ("reduce_scatter_tensor", "reduce_scatter", lambda a: _nbytes(a[0]),
                                    lambda a: a[3]),
}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class FunctionalCollectiveCounter(CommDebugMode):
    """CommDebugMode plus bytes: every functional collective becomes a `CommRecord` in `self.records`, and in the
    active `CommTracer` if there is one (the training loop's)."""

    def __init__(self):
        super().__init__()
        self.records: list[CommRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        found = _COLLECTIVES.get(getattr(func, "_overloadpacket", None))
        if found is not None and out is not NotImplemented:  # NotImplemented: DTensor runs first, then us
            name, ring_op, payload, group_name = found
            ranks = tuple(dist.get_process_group_ranks(c10d._resolve_process_group(group_name(args))))
            S, tracer = payload(args), CommTracer.active()
            sent = ring_bytes_sent(ring_op, S, len(ranks))
            record = CommRecord(name, S, sent, sent, len(ranks), ranks, None, tracer.steps if tracer else 0,
                                "backward" if self.advanced_module_tracker.is_bw else "forward")
            self.records.append(record)
            if tracer is not None:
                tracer.add(record)
        return out
