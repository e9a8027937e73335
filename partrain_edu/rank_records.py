"""One record per rank, handed back to the notebook: the bookkeeping at the end of a rank program.

    %%torchrun -n 4
    from partrain_edu.comm import CommTracer
    from partrain_edu.rank_records import publish_every_rank, traffic
    ...
    with CommTracer() as tracer:
        ring_all_reduce(x)
    publish_every_rank("ring", {"equal": torch.equal(x, expected), **traffic(tracer)})
    # in the notebook, afterwards: ring[r] is rank r's record

`runtime.publish` hands back rank 0's value only; a lesson that compares ranks (who sent what, who holds what)
needs every rank's. `publish_every_rank` gathers them first with `all_gather_object`: call it after a CommTracer's
block, not inside it, or the tracer records that gather as well.
"""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from partrain_edu import runtime


def publish_every_rank(name: str, record: Any, group=None) -> list:
    """Gather `record` from every rank of `group` (default: the world) and publish the list as `name`, rank r's
    record at index r (group ranks). Every rank of the group must call it, like any collective."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, record, group=group)
    runtime.publish(name, everyone)
    return everyone


def traffic(tracer) -> dict[str, int]:
    """What a `CommTracer` saw this rank send and receive, in bytes: {"sent": ..., "received": ...}.
    Point-to-point calls are counted byte by byte; collectives are priced with the ring model (`comm`)."""
    return {"sent": tracer.total_sent(), "received": sum(record.received for record in tracer.records)}
