"""Problems of chapter 02 (data parallelism): DDP's bytes per step, `no_sync`, the link time, buckets and overlap.

Keys come from `theory.traffic` (step_traffic, ring_bytes_sent, link_time, collective_time, bucketed_backward_end,
LINKS), the functions notebook 02 prices DDP's all-reduce and its overlap with.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.traffic import (
    LINKS,
    bucketed_backward_end,
    collective_time,
    link_time,
    ring_bytes_sent,
    step_traffic,
)

MODELS = [0.35, 0.76, 1.3, 2.7, 6.7, 13]                 # billions of parameters (GPT-3 sizes, Brown et al. 2020)
DTYPES = {2: "bf16", 4: "fp32"}


def _ddp_gb(psi: int, n: int, b: int = 2) -> float:
    return step_traffic("ddp", params=psi, dp=n, bytes_per_element=b).per_rank_bytes_sent / 1e9


@problem("02.ddp-bytes", "Bytes one DDP rank sends per step", unit="GB", kind="one step",
         formula="sent = 2(n−1)/n · Ψ·b: one ring all-reduce of the Ψ gradients of b bytes each",
         source="Li et al. 2020 (PyTorch Distributed) §3.2; Rajbhandari et al. 2020 §7.1; notebook 02, "
                "'DDP: one process per device, gradients averaged'")
def ddp_bytes(rng) -> Drawn:
    psi = int(rng.choice(MODELS) * 1e9)
    n = rng.choice([4, 8, 16, 32, 64])
    b = rng.choice([2, 4])
    key = _ddp_gb(psi, n, b)
    if b == 2:
        dtype_slip = (_ddp_gb(psi, n, 4), "the gradients counted in fp32, not bf16")
    else:
        dtype_slip = (_ddp_gb(psi, n, 1), "the parameter count taken for the bytes: each fp32 gradient is 4 B")
    return Drawn(f"DDP trains a {psi / 1e9:g}B-parameter model on {n} GPUs with {DTYPES[b]} gradients and no "
                 "gradient accumulation. How many GB does one rank send per step?", key,
                 given={"psi": psi, "n": n, "b": b},
                 mistakes=[dtype_slip,
                           (2 * psi * b / 1e9, "the (n−1)/n factor dropped: each rank sends 2(n−1) chunks of "
                            "S/n, not the whole gradient twice"),
                           (ring_bytes_sent("reduce_scatter", psi * b, n) / 1e9, "only the reduce-scatter half "
                            "counted: the all-gather sends as much again")])


@problem("02.no-sync", "What no_sync saves under gradient accumulation", unit="GB", kind="judgement",
         formula="saved = (M−1) · 2(n−1)/n · Ψ·b: without no_sync every one of the M backwards all-reduces",
         source="Li et al. 2020 (PyTorch Distributed) §3.2.4; notebook 02, 'Gradient accumulation with no_sync'")
def no_sync(rng) -> Drawn:
    psi = int(rng.choice(MODELS) * 1e9)
    n = rng.choice([8, 24, 32, 48, 64])        # never M: then M all-reduces cost as much as M−1 without (n−1)/n
    m = rng.choice([3, 4, 6, 12, 16])
    key = (m - 1) * _ddp_gb(psi, n)
    return Drawn(f"DDP on {n} GPUs accumulates the bf16 gradients of a {psi / 1e9:g}B-parameter model over {m} "
                 "micro-batches per step. Wrapping all but the last backward in no_sync() or not: how many GB "
                 "per step does a rank send less with no_sync?", key, given={"psi": psi, "n": n, "M": m},
                 mistakes=[(m * _ddp_gb(psi, n), "all M all-reduces counted as saved: with no_sync the last "
                            "one still runs"),
                           ((m - 1) * 2 * psi * 2 / 1e9, "the (n−1)/n factor dropped from each all-reduce"),
                           ((m - 1) * _ddp_gb(psi, n, 4), "the gradients counted in fp32, not bf16")])


@problem("02.link-time", "The gradient all-reduce's time on the link", unit="ms", kind="several steps",
         formula="t ≥ 2(n−1)/n · Ψ·b / β (bandwidth only, a lower bound; β one direction, 1 Gb/s = 0.125 GB/s)",
         source="Hockney 1994 (α–β); Patarasuk & Yuan 2009; notebook 02, 'DataParallel: one process, every "
                "byte through device 0' (link_time)")
def link_seconds(rng) -> Drawn:
    psi = int(rng.choice(MODELS) * 1e9)
    link = rng.choice(["nvlink", "infiniband"])
    if link == "nvlink":
        n = rng.choice([4, 8])
        where = f"{n} GPUs of one node on NVLink 4 (900 GB/s per GPU, both directions together)"
        slip = (link_time(ring_bytes_sent("all_reduce", 2 * psi, n), link) / 2 * 1e3,
                "900 GB/s used as one direction's bandwidth: it counts both directions, 450 GB/s each way")
    else:
        n = rng.choice([4, 8, 16, 32, 64])
        where = f"{n} nodes of one GPU each, on InfiniBand NDR (400 Gb/s per GPU each way)"
        slip = (link_time(ring_bytes_sent("all_reduce", 2 * psi, n), link) / 8 * 1e3,
                "400 Gb/s read as 400 GB/s: divide the bits by 8")
    sent = step_traffic("ddp", params=psi, dp=n).per_rank_bytes_sent
    key = link_time(sent, link) * 1e3
    return Drawn(f"DDP all-reduces the bf16 gradients of a {psi / 1e9:g}B-parameter model over {where}. At the "
                 "link's full bandwidth (no latency, no overlap), at least how many ms does the all-reduce take?",
                 key, given={"psi": psi, "n": n, "beta": LINKS[link]},
                 mistakes=[slip,
                           (link_time(2 * psi * 2, link) * 1e3, "the (n−1)/n factor dropped: a rank sends "
                            "2(n−1)/n of the gradient bytes"),
                           (link_time(2 * psi, link) * 1e3, "the gradient's own bytes: a ring all-reduce sends "
                            "about twice them")])


@problem("02.bucket-overlap", "What buckets that overlap backward save", unit="ms", kind="several steps",
         formula="C = 2(n−1)/n · Ψ·b / β; k buckets end at max(B + C/k, B/k + C): saved (1 − 1/k)·min(B, C) "
                 "against one all-reduce after backward",
         source="Li et al. 2020 (PyTorch Distributed) §3.2.3; notebook 02, 'Overlap: buckets leave while "
                "backward goes on' (bucketed_backward_end)")
def bucket_overlap(rng) -> Drawn:
    psi = int(rng.choice(MODELS[:4]) * 1e9)
    n = rng.choice([2, 16, 32, 64])     # never k: dropping (n−1)/n would then hide exactly C, another slip
    k = rng.choice([4, 5, 8, 10])
    backward = rng.randint(20, 400) * 1e-3
    beta = LINKS["infiniband"]
    sizes = [2 * psi // k] * k                              # bf16 gradients in k equal buckets

    def saved(bucket_seconds: list[float]) -> float:        # one bucket after backward, minus k buckets
        one = bucketed_backward_end(backward, [sum(bucket_seconds)], [backward])
        return (one - bucketed_backward_end(backward, bucket_seconds)) * 1e3

    key = saved([collective_time("all_reduce", s, n, alpha=0, beta=beta) for s in sizes])
    comm = sum(collective_time("all_reduce", s, n, alpha=0, beta=beta) for s in sizes) * 1e3
    return Drawn(f"Backward of a {psi / 1e9:g}B-parameter model takes {backward * 1e3:g} ms and produces its bf16 "
                 f"gradients evenly; DDP on {n} GPUs (InfiniBand, 50 GB/s each way, no latency) all-reduces them "
                 f"in {k} equal buckets, one at a time, each as soon as it is full. How many ms sooner are the "
                 "gradients averaged than with one all-reduce after backward?", key,
                 given={"psi": psi, "n": n, "k": k, "B": backward, "beta": beta},
                 mistakes=[(min(backward * 1e3, comm), "the whole shorter of backward and "
                            "communication hidden: the last bucket is full only when backward ends"),
                           (min(backward * 1e3, comm) / k, "only one bucket's share hidden: all but "
                            "the last bucket overlap backward"),
                           (saved([2 * s / beta for s in sizes]), "each bucket priced as 2S/β, the "
                            "(n−1)/n factor dropped")])


@problem("02.per-tensor-latency", "One bucket against one all-reduce per tensor", unit="ms", kind="judgement",
         formula="T all-reduces of S/T against one of S: the bytes are equal, the latency (T−1)·2(n−1)·α extra",
         source="Li et al. 2020 (PyTorch Distributed) §3.2.2; Hockney 1994; notebook 02, 'What the per-call "
                "latency costs: α and β for Gloo on this machine'")
def per_tensor_latency(rng) -> Drawn:
    tensors = rng.choice([69, 100, 148, 292, 388])
    each = rng.randint(1, 40) * 1_000_000
    n = rng.choice([2, 4, 8, 16, 32, 64])
    alpha = rng.choice([3, 5, 10, 30, 100, 300]) * 1e-6
    beta = rng.choice([25, 50, 100, 450]) * 1e9
    per_tensor = tensors * collective_time("all_reduce", each, n, alpha=alpha, beta=beta)
    one = collective_time("all_reduce", tensors * each, n, alpha=alpha, beta=beta)
    key = (per_tensor - one) * 1e3
    return Drawn(f"A model's gradients are {tensors} tensors of {each / 1e6:g} MB each, all-reduced by a ring over "
                 f"{n} ranks at α = {alpha * 1e6:g} µs per message and β = {beta / 1e9:g} GB/s. How many ms does "
                 "one all-reduce of one bucket holding them all take less than one all-reduce per tensor?", key,
                 given={"T": tensors, "S_each": each, "n": n, "alpha": alpha, "beta": beta},
                 mistakes=[(per_tensor * 1e3, "the per-tensor all-reduces' whole time: the bytes "
                            "term is the same both ways, only the messages differ"),
                           ((tensors - 1) * 2 * alpha * 1e3, "one message per all-reduce: a ring "
                            "all-reduce sends 2(n−1), one per ring step"),
                           ((tensors - 1) * (n - 1) * alpha * 1e3, "only n−1 ring steps: an "
                            "all-reduce is a reduce-scatter and an all-gather")])
