"""What each rank runs for a multi-rank check (started by on_ranks.py): the check's observe half, beside the
learner's functions, compiled from their source into the namespace on_ranks.namespace_for gives them.

Rank 0 gathers every rank's observations and publishes them as one JSON *text*. The learner's code shares these
processes, so it can publish anything instead; the trusted caller therefore treats the text as untrusted data
and recomputes every expected value itself (observations.verify). No verdict is made here.
"""
from __future__ import annotations

import json
import sys

import torch.distributed as dist

from partrain_edu.grading.on_ranks import namespace_for
from partrain_edu.grading.runner import spec_of


def main() -> None:
    """On each rank: JOB = {"check", "sources", "names", "seed"}; rank 0 publishes "observations", a JSON text of the
    list of every rank's observations."""
    from partrain_edu import runtime

    with open(sys.argv[1]) as f:
        job = json.load(f)
    ctx = runtime.init()
    spec = spec_of(job["check"], len(job["sources"]))
    namespace = namespace_for(spec)
    functions = []
    for source, name in zip(job["sources"], job["names"], strict=True):
        exec(compile(source, f"<your {name}>", "exec"), namespace)
        functions.append(namespace[name])
    mine = spec.observe(ctx, *functions, seed=job["seed"])
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    runtime.publish("observations", json.dumps(everyone))  # text, not objects: the caller only json-decodes it
    runtime.shutdown()
