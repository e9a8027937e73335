"""Problems of chapter 01 (collectives): the bytes a rank sends in a ring, the α–β time, bus bandwidth.

Keys come from `theory.traffic` (ring_bytes_sent, collective_time), the functions notebook 01 measures against.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.traffic import collective_time, ring_bytes_sent

RING = "Patarasuk & Yuan 2009, bandwidth-optimal all-reduce; notebook 01, 'Bytes per rank'"


@problem("01.ring-all-reduce", "Bytes one rank sends in a ring all-reduce", unit="MB", kind="one step",
         formula="sent = 2(n−1)/n · S: a reduce-scatter, then an all-gather, each (n−1) chunks of S/n",
         source=RING)
def ring_all_reduce(rng) -> Drawn:
    n = rng.choice([3, 4, 6, 8, 12, 16, 32, 64])
    size = rng.randint(20, 2000) * 1_000_000
    key = ring_bytes_sent("all_reduce", size, n) / 1e6
    return Drawn(f"{n} ranks all-reduce a {size / 1e6:g} MB gradient with a ring. How many MB does one rank "
                 "send?", key, given={"n": n, "S": size},
                 mistakes=[(2 * size / 1e6, "the (n−1)/n factor dropped: each rank sends n−1 chunks of S/n, "
                            "twice, not the whole tensor twice"),
                           ((n - 1) * size / n / 1e6, "only the reduce-scatter half counted: the all-gather "
                            "sends as much again"),
                           (size / 1e6, "the tensor's own size: a rank sends 2(n−1)/n of it")])


@problem("01.all-gather", "Bytes one rank sends in a ring all-gather", unit="MB", kind="one step",
         formula="sent = (n−1)/n · S for an all-gather whose result is S (each rank's S/n forwarded n−1 times)",
         source=RING)
def all_gather(rng) -> Drawn:
    n = rng.choice([3, 4, 8, 16, 32])
    shard = rng.randint(5, 500) * 1_000_000     # each rank's piece
    full = n * shard
    key = ring_bytes_sent("all_gather", full, n) / 1e6
    return Drawn(f"Each of {n} ranks holds a {shard / 1e6:g} MB shard; a ring all-gather gives every rank all "
                 f"{n} shards. How many MB does one rank send?", key, given={"n": n, "shard": shard},
                 mistakes=[(full / 1e6, "the whole gathered tensor: a rank sends n−1 shards, never its result"),
                           (shard / 1e6, "one shard: in a ring each rank forwards n−1 of them"),
                           (2 * key, "counted like an all-reduce: an all-gather is only the second half")])


@problem("01.alpha-beta", "Time of one all-reduce, α–β model", unit="ms", kind="several steps",
         formula="t = 2(n−1)·α + 2(n−1)/n · S / β (α per message, β in bytes/s; 1 Gb/s = 0.125 GB/s)",
         source="Hockney 1994 (α–β); Thakur, Rabenseifner & Gropp 2005 §2; notebook 01, 'Bus bandwidth'")
def alpha_beta(rng) -> Drawn:
    n = rng.choice([4, 8, 16, 32])
    size = rng.randint(1, 400) * 1_000_000
    alpha = rng.choice([2, 5, 10, 20, 50]) * 1e-6
    gbits = rng.choice([10, 25, 100, 200, 400])
    beta = gbits * 1e9 / 8
    key = collective_time("all_reduce", size, n, alpha=alpha, beta=beta) * 1e3
    return Drawn(f"A ring all-reduce of {size / 1e6:g} MB over {n} ranks; each message costs α = "
                 f"{alpha * 1e6:g} µs and each link carries {gbits} Gb/s. How many ms does it take?", key,
                 given={"n": n, "S": size, "alpha": alpha, "gbits": gbits},
                 mistakes=[(collective_time("all_reduce", size, n, alpha=alpha, beta=gbits * 1e9) * 1e3,
                            "Gb/s read as GB/s: divide the bits by 8"),
                           (collective_time("all_reduce", size, n, alpha=0, beta=beta) * 1e3,
                            "the latency term 2(n−1)·α left out"),
                           (collective_time("reduce_scatter", size, n, alpha=alpha, beta=beta) * 1e3,
                            "one half only (n−1 steps): an all-reduce is a reduce-scatter and an all-gather")])


@problem("01.bus-bandwidth", "Bus bandwidth from a measured all-reduce", unit="GB/s", kind="several steps",
         formula="busbw = algbw · 2(n−1)/n, algbw = S / t (nccl-tests' definition)",
         source="NVIDIA nccl-tests, doc/PERFORMANCE.md; notebook 01, 'Bus bandwidth'")
def bus_bandwidth(rng) -> Drawn:
    n = rng.choice([2, 4, 8, 16])
    size = rng.choice([64, 128, 256, 512, 1024]) * 2 ** 20
    t = rng.randint(5, 200) * 1e-3
    algbw = size / t
    key = algbw * 2 * (n - 1) / n / 1e9
    return Drawn(f"nccl-tests times an all-reduce of {size // 2 ** 20} MiB on {n} GPUs at {t * 1e3:g} ms. What "
                 "bus bandwidth, in GB/s, does it report?", key, given={"n": n, "S": size, "t": t},
                 mistakes=[(algbw / 1e9, "the algorithm bandwidth S/t: bus bandwidth multiplies it by "
                            "2(n−1)/n, the share of S each link carries"),
                           (key * 1e9 / 2 ** 30, "GiB/s: nccl-tests report GB/s (10⁹ B/s)"),
                           (key * 2 ** 20 / 1e6, "MiB read as MB: S is 2²⁰ bytes per MiB")])


@problem("01.naive-vs-ring", "Reduce-then-broadcast at rank 0 against a ring", unit="×", kind="judgement",
         formula="rank 0 sends (n−1)·S broadcasting the sum; a ring rank sends 2(n−1)/n·S: the ratio is n/2",
         source="Patarasuk & Yuan 2009 §1; notebook 01, 'The ring all-reduce, built by hand'")
def naive_vs_ring(rng) -> Drawn:
    n = rng.choice([4, 8, 16, 32, 64, 128])
    size = rng.randint(10, 900) * 1_000_000
    naive = (n - 1) * size      # rank 0 sends the sum to each of the n−1 others
    key = naive / ring_bytes_sent("all_reduce", size, n)
    return Drawn(f"{n} ranks each hold a {size / 1e6:g} MB gradient. Scheme A: everyone sends to rank 0, which "
                 "sums and sends the result back to each. Scheme B: a ring all-reduce. How many times more bytes "
                 "does rank 0 send in A than any rank sends in B?", key, given={"n": n, "S": size},
                 mistakes=[(n - 1, "ring bytes taken as S: a ring rank sends 2(n−1)/n·S, not S"),
                           (2 * (n - 1), "rank 0's receiving counted as sending, or the ring's 2 left out")])
