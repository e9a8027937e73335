"""Make PyTorch DDP's gradient all-reduce visible to `CommTracer`.

DDP's reducer launches its bucket all-reduces in C++, where the tracer's patch of `torch.distributed`'s Python
functions cannot see them. `traced_allreduce_hook` is a DDP communication hook that makes the very same call
through `torch.distributed.all_reduce`:

    ddp_model.register_comm_hook(None, traced_allreduce_hook)    # or a process group instead of None
"""
from __future__ import annotations

import torch.distributed as dist


def traced_allreduce_hook(process_group, bucket):  # -> Future[Tensor]; DDP rejects a string annotation
    """DDP comm hook with the semantics of PyTorch's default one (``default_hooks.allreduce_hook``): divide
    the bucket by the world size, all-reduce it through ``torch.distributed.all_reduce``, hand back the
    averaged buffer."""
    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))       # divide first, as torch does, to avoid fp16 overflow
    work = dist.all_reduce(tensor, group=group, async_op=True)   # looked up now: the traced one if active
    return work.get_future().then(lambda fut: fut.value()[0])
