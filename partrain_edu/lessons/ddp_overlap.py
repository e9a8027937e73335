"""DDP's overlap of communication with backward, timed on the emulated device (a lens for seconds; notebook 02).

    from partrain_edu.lessons.ddp_overlap import exposed_communication
    exposed_communication(nproc=8, device="emulated:a100,scale=1")     # three ways to synchronise, 8 ranks

TinyGPT's blocks are charged as GPT-3 XL's layers and its gradients priced at GPT-3 XL's bf16 bytes
(`strategies.emulation.charge_tinygpt`), so a step's seconds are those of a 1.3B model on the emulated GPUs.
- `timed_step` times one forward + backward (+ an after-backward synchronisation) on the emulated clock, after a
  warm-up: the step, the charged compute inside it, and the rest — communication that did not hide (exposed).
- `bucket_seconds` prices each DDP bucket's all-reduce with the α–β model of the link the ranks share: the
  input of `theory.traffic.bucketed_backward_end`, the model the measured overlap is compared with.
- `exposed_communication` runs the same TinyGPT three ways on `nproc` ranks (the ranks' side is
  `python -m partrain_edu.lessons.ddp_overlap`): one all-reduce per parameter after backward (`ddp-naive`), one
  bucket after backward, and buckets that leave while backward goes on (`ddp` with a 256 KiB cap: 4 buckets).
"""
from __future__ import annotations

import sys
from typing import Callable

import torch.distributed as dist

from partrain_edu.models import TinyGPT

BUCKET_CAP = 256 * 1024          # TinyGPT's 0.87 MB of gradients in 4 buckets (notebook 02)
ONE_BUCKET = 1 << 30             # every gradient in one bucket: it leaves when backward has ended
VARIANTS = ("per parameter, after backward", "one bucket, after backward", "4 buckets, during backward")


def timed_step(em, model, x, y, sync: Callable | None = None, repeats: int = 2) -> dict:
    """Emulated seconds of one forward + backward (+ `sync(parameters)` after it) of a (wrapped) TinyGPT whose
    blocks are charged on `em`; the last of `repeats` (the first is a warm-up). {"step_s", "compute_s",
    "exposed_s"}: exposed = the step's seconds that were not charged compute, i.e. communication nobody hid."""
    for _ in range(repeats):
        model.zero_grad(set_to_none=True)
        dist.barrier()                                       # every rank starts the step together
        charged, start = em.charged_s, em.now()
        TinyGPT.loss(model(x), y).backward()
        if sync is not None:
            sync(model.parameters())
        step, compute = (em.now() - start) / em.scale, (em.charged_s - charged) / em.scale
    return {"step_s": step, "compute_s": compute, "exposed_s": step - compute}


def bucket_seconds(em, ddp_model) -> list[float]:
    """α–β seconds of each bucket's all-reduce of `ddp_model` (our DistributedDataParallel), at the bytes the
    emulator charges (`em.bytes_scale`) over the slowest link among the ranks."""
    ranks = range(dist.get_world_size())
    return [em.collective_seconds("all_reduce", b.nbytes * em.bytes_scale, ranks) for b in ddp_model.buckets]


def _rank_main() -> None:
    from partrain_edu import runtime
    from partrain_edu.data import SyntheticTokens, data_parallel_slice
    from partrain_edu.parallel.ddp import DistributedDataParallel, allreduce_per_parameter
    from partrain_edu.strategies.emulation import charge_tinygpt

    ctx = runtime.init(device=sys.argv[1])
    em = ctx.emulator
    x, y = data_parallel_slice(*SyntheticTokens().global_batch(0, 16), ctx.rank, ctx.world_size)
    results = {}
    for name in VARIANTS:
        if name.startswith("per parameter"):
            model, sync = TinyGPT(), allreduce_per_parameter
        else:
            cap = BUCKET_CAP if name.startswith("4 buckets") else ONE_BUCKET
            model, sync = DistributedDataParallel(TinyGPT(), bucket_cap_bytes=cap, clock=em.now), None
        charge_tinygpt(em, model, samples=len(x))
        results[name] = timed_step(em, model, x, y, sync)
    runtime.publish("results", {"ranks": ctx.world_size, "link": em.link_of(tuple(range(ctx.world_size)))[0],
                                "variants": results})
    runtime.shutdown()


def exposed_communication(nproc: int = 8, device: str = "emulated:a100,scale=1") -> dict:
    """Run the three synchronisations of TinyGPT on `nproc` ranks of `device`: {"ranks", "link", "variants":
    {name: {"step_s", "compute_s", "exposed_s"}}}, emulated seconds of one step."""
    from partrain_edu.launcher import torchrun

    done = torchrun("", nproc=nproc, module="partrain_edu.lessons.ddp_overlap", args=[device], echo=None)
    return done.published["results"]


if __name__ == "__main__":
    _rank_main()
