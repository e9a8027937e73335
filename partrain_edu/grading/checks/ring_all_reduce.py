"""Exercise 01, a ring all-reduce (环形全归约) from isend/irecv on 3 ranks, for tensors of 12, 7 and 2 elements.

Graded per rank: the result equals the sum of every rank's input (what dist.all_reduce gives), no collective is
called, a rank sends only to its right neighbour and receives only from its left, and it sends exactly the
ring's 2(n−1)/n·S bytes (parallel.ring.ring_bytes_sent_by). Element i of rank r's input is 2^r + 8·i (notebook
01's 2^r trick), so a wrong element is read back as the set of ranks it summed and the position it came from.
"""
from __future__ import annotations

import torch

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import register
from partrain_edu.parallel.ring import chunk_bounds, ring_bytes_sent_by

RING_LENGTHS = (12, 7, 2)  # divisible by 3 ranks, not divisible (uneven chunks), fewer elements than ranks
RING_RANKS = 3
RING_TAG = 2 ** RING_RANKS  # > 2^0 + 2^1 + 2^2: the low bits of a sum say which ranks it holds


def ring_input(numel: int, rank: int) -> torch.Tensor:
    """Element i of rank r is 2^r + 8·i (notebook 01's 2^r trick): a sum over ranks S at position i is
    Σ_{r∈S} 2^r + |S|·8·i, so a wrong element tells which ranks it summed and which position it came from."""
    return 2.0 ** rank + RING_TAG * torch.arange(numel, dtype=torch.float32)


def decode_ring_sum(value: float, nproc: int, numel: int) -> tuple[set[int], int] | None:
    """(the ranks, the position) a sum of `nproc` ranks' ring_input(numel) elements `value` holds, or None when it
    is no such sum (tagged bits of a rank that does not exist, or a position past the end, are none)."""
    if value != int(value) or value <= 0:
        return None
    bits = int(value) % RING_TAG
    ranks = {r for r in range(RING_RANKS) if bits >> r & 1}
    rest = int(value) - bits
    if not ranks or max(ranks) >= nproc or rest % (RING_TAG * len(ranks)):
        return None
    position = rest // (RING_TAG * len(ranks))
    return (ranks, position) if position < numel else None


COLLECTIVES = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "reduce_scatter_single",
               "all_gather_single"}


def observe(ctx, ring_all_reduce, *, seed: int) -> list[dict]:
    runs = []
    for numel in RING_LENGTHS:
        tensor_in = ring_input(numel, ctx.rank)
        with CommTracer() as tracer:
            out = ring_all_reduce(tensor_in)
        runs.append({"out": tensor(out if out is not None else tensor_in), **traffic(tracer)})
    return runs


@register("ring_all_reduce", nproc=3, observe=observe, given={"chunk_bounds": chunk_bounds},
          summary="sums equal dist.all_reduce for lengths 12, 7 and 2 on 3 ranks, and each rank sent exactly "
          "the ring's 2(n−1)/n·S bytes, point-to-point only, to its right neighbour only",
          deadlock_hint="Likely: every rank posts a blocking recv (or send) first, so all wait for a message "
          "nobody sends — post the receive with irecv and the send with isend, then wait on both; or two "
          "neighbours disagree on a chunk's size (use the same chunk boundaries on every rank).")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for numel, run in zip(RING_LENGTHS, observed.items(len(RING_LENGTHS))):
        given = [ring_input(numel, r) for r in range(n)]
        mine, expected = given[me], torch.stack(given).sum(0)
        got = run["out"].tensor()
        problem = differ(f"length {numel} on {n} ranks", expected, got)
        if problem:
            diagnosis, scaled = ring_diagnosis(expected, got, given, me)
            return [problem + diagnosis + ("" if scaled else " Hint: rank r sends chunk (r − s − 1) mod n and "
                    "adds the one it receives in reduce-scatter step s, then forwards chunk (r − s) mod n in "
                    "all-gather step s; chunk boundaries must match on every rank (first numel % n chunks one "
                    "longer).")]
        used = sorted(set(run["ops"].counts()) & COLLECTIVES)
        if used:
            return [f"length {numel}: you called {used}; build the all-reduce from isend/irecv (send/recv) only"]
        peers = {op: set(run["peers"][op].numbers()) for op in run["peers"].keys()}
        right, left = (me + 1) % n, (me - 1) % n
        sent_to = peers.get("isend", set()) | peers.get("send", set())
        heard_from = peers.get("irecv", set()) | peers.get("recv", set())
        if not sent_to <= {right} or not heard_from <= {left}:
            return [f"length {numel}: rank {me} sent to rank(s) {sorted(sent_to)} and received from "
                    f"{sorted(heard_from)}; in a ring each rank sends only to its right neighbour ({right}) and "
                    f"receives only from its left ({left}) — every link carries 1/n of the tensor per step"]
        want, sent = ring_bytes_sent_by(me, numel, mine.element_size(), n), run["sent"].count()
        if sent != want:
            return [f"length {numel}: sent {sent} bytes, the ring sends exactly {want} (2(n−1)/n·S with S = "
                    f"{numel * mine.element_size()} B: every chunk but one per phase). "
                    + ("More means whole tensors or extra chunks travel." if sent > want else
                       "Less means some chunk never travelled.")]
    return []


def ring_diagnosis(expected: torch.Tensor, got, given: list[torch.Tensor], me: int) -> tuple[str, bool]:
    """What the first wrong element holds, and whether the answer scaled rank `me`'s input. The element is read
    as the sum of a set of the ranks' inputs `given` at one position (their 2^r tags, ring_input)
    when it is one; otherwise it is said to be no such sum: a ring only adds and moves chunks, so something else
    changed it."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return ".", False
    got, expected = got.double().reshape(-1), expected.double().reshape(-1)
    wrong = next((i for i in range(got.numel()) if abs(got[i] - expected[i]) > 1e-4), None)
    if wrong is None:
        return ".", False
    value, want = float(got[wrong]), float(expected[wrong])
    scale = ratio_of(given[me].double().reshape(-1), got)
    if scale is not None and abs(scale - 1) > 1e-3:
        return (f". Element {wrong} holds {value:g}, which is no sum of the ranks' inputs (expected {want:g}): every "
                f"element is {scale:g}× this rank's own input — each element must be added to the other ranks' "
                "values, not scaled.", True)
    decoded = decode_ring_sum(value, len(given), got.numel())
    if decoded is not None:
        ranks, position = decoded
        missing = sorted(set(range(len(given))) - ranks)
        return (f". Element {wrong} holds the sum of rank(s) {sorted(ranks)}"
                + (f" (rank(s) {missing} never added)" if missing else "")
                + (f" of element {position}: a chunk landed in the wrong place" if position != wrong else "")
                + ".", False)
    return (f". Element {wrong} holds {value:g}, which is no sum of the ranks' inputs (expected {want:g}): a ring "
            "only adds received chunks and copies them, so something else changed this value.", False)
