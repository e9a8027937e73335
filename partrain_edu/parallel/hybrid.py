"""What 3D parallelism (3D 并行) adds to its three parts: the dp gradient average after the pipeline has drained,
and the bill of what each dimension sent.

    ctx = runtime.init(dp=2, tp=2, pp=2)                  # the groups, from the one rank grid (theory.grid)
    partrain-edu train --strategy 3d --nproc 8 --dp 2 --tp 2 --pp 2 --microbatches 2 --json

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", §3):
ranks follow theory.grid's order (pp outermost, tp innermost: Megatron-Core's default); rank (s, d, t) holds
stage s's layers, their t-th tensor slice, and trains on the d-th slice of the batch. The tp group
all-reduces activations in every layer (tensor.py); the pp group passes activations between stages (pipeline.py);
the dp group all-reduces this rank's Ψ/(pp·tp) gradients once per step, 2(dp−1)/dp of them.
"""
from __future__ import annotations

from partrain_edu.parallel.buckets import allreduce_mean
from partrain_edu.theory.grid import ORDER


def dimension_of(record, topology) -> str:
    """Which grid dimension a `CommRecord` travelled along: a collective by its group's ranks, a p2p
    message (sent on the world group) by its peer."""
    for dim in ORDER:
        if tuple(record.group_ranks) == tuple(topology.ranks[dim]):
            return dim
    if record.peer is not None and record.peer in topology.ranks["pp"]:
        return "pp"
    return "world"


def traffic_by_dimension(records, topology) -> dict[str, dict[str, int]]:
    """{dim: {"calls", "bytes"}} this rank sent along each dimension (ring cost model, `CommRecord.sent`)."""
    out = {dim: {"calls": 0, "bytes": 0} for dim in (*ORDER, "world")}
    for r in records:
        entry = out[dimension_of(r, topology)]
        entry["calls"] += 1
        entry["bytes"] += r.sent
    return out


def dp_average_gradients(buckets, group, size: int) -> None:
    """After the pipeline has drained: average each bucket of gradients over the data-parallel group
    (DDP's bucketed all-reduce, without the overlap: the last micro-batch's backward is already done)."""
    for bucket in buckets:
        allreduce_mean(bucket, group, size)
