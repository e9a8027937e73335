"""The ring algorithms step by step: which rank sends which chunk to whom, and what every buffer holds after.

    >>> [(t.src, t.dst, t.chunk) for t in ring_steps("all_reduce", 3)[0]]
    [(0, 1, 2), (1, 2, 0), (2, 0, 1)]

traffic.py counts the bytes of the ring algorithms (Patarasuk & Yuan 2009, the algorithm NCCL's rings run);
this module lists the moves that produce those bytes, so a widget can step through them and a test can check
that they add up to the same bytes (:func:`bytes_sent_per_rank` equals ``traffic.ring_bytes_sent``). Every
rank's buffer of S bytes is cut into n chunks of S/n; rank i only ever sends to its right neighbour i+1 (mod n):

- ``reduce_scatter``: n−1 steps. At step k rank i sends chunk (i−k−1) mod n, and its neighbour *adds* it to
  its own copy. After the last step rank i holds chunk i summed over all ranks (as in PyTorch's
  reduce_scatter, rank i gets shard i). Each rank sends n−1 chunks: (n−1)/n · S.
- ``all_gather``: n−1 steps. Rank i starts with chunk i; at step k it forwards chunk (i−k) mod n (the one it
  received the step before), and the neighbour *stores* it. Each rank sends (n−1)/n · S.
- ``all_reduce``: a reduce-scatter, then an all-gather of the reduced chunks: 2(n−1) steps, 2(n−1)/n · S.
- ``broadcast``: a pipelined ring from rank 0: the root sends its n chunks one per step, and every rank
  forwards a chunk one step after it arrives; 2n−2 steps (n−1 hops plus n−1 more chunks behind the first).
  Every rank but the last sends all S bytes (traffic.py's "broadcast S").
- ``all_to_all``: not a ring: at step k (1 ≤ k < n) rank i sends chunk (i+k) mod n — the part meant for
  rank i+k — straight to that rank (the pairwise exchange of MPI implementations). Rank i's output chunk j
  comes from rank j. Each rank sends (n−1)/n · S. (traffic.py does not list it: the strategies here do not
  use it; mixture-of-experts models do, for expert parallelism.)

A buffer's state is, per rank and chunk, the set of ranks whose data that chunk holds: ``{i}`` for rank i's
own chunk before a reduction, all n ranks once fully reduced, empty when nothing has arrived yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")


@dataclass(frozen=True)
class Transfer:
    src: int
    dst: int
    chunk: int        # index of the S/n-byte chunk sent (all_to_all: of the sender's input buffer)
    reduce: bool      # True: the receiver adds it to its chunk; False: it stores (overwrites) it


def _check(op: str, n: int) -> None:
    if op not in RING_OPS:
        raise ValueError(f"op must be one of {', '.join(RING_OPS)}, got {op!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of ranks must be a positive whole number, got {n!r}")


def ring_steps(op: str, n: int) -> tuple[tuple[Transfer, ...], ...]:
    """The transfers of each step of ``op`` over ``n`` ranks (they all happen at once within a step)."""
    _check(op, n)
    if n == 1:
        return ()
    right = [(i + 1) % n for i in range(n)]
    reduce_scatter = [tuple(Transfer(i, right[i], (i - k - 1) % n, True) for i in range(n)) for k in range(n - 1)]
    all_gather = [tuple(Transfer(i, right[i], (i - k) % n, False) for i in range(n)) for k in range(n - 1)]
    if op == "reduce_scatter":
        steps = reduce_scatter
    elif op == "all_gather":
        steps = all_gather
    elif op == "all_reduce":
        steps = reduce_scatter + all_gather
    elif op == "broadcast":  # at step t, the rank r hops after the root forwards chunk t − r
        steps = [tuple(Transfer(r, r + 1, t - r, False) for r in range(n - 1) if 0 <= t - r < n)
                 for t in range(2 * n - 2)]
    else:  # all_to_all: pairwise exchange, distance k at step k
        steps = [tuple(Transfer(i, (i + k) % n, (i + k) % n, False) for i in range(n)) for k in range(1, n)]
    return tuple(steps)


def initial_state(op: str, n: int) -> list[list[frozenset[int]]]:
    """state[rank][chunk]: whose data each chunk holds before the first step."""
    _check(op, n)
    if op in ("all_reduce", "reduce_scatter"):   # every rank holds its full contribution
        return [[frozenset({i})] * n for i in range(n)]
    if op == "all_gather":                       # rank i holds only its own chunk i
        return [[frozenset({i}) if c == i else frozenset() for c in range(n)] for i in range(n)]
    if op == "broadcast":                        # only the root holds anything
        return [[frozenset({0}) if i == 0 else frozenset()] * n for i in range(n)]
    # all_to_all, output buffer: slot j will hold rank j's part; rank i starts with its own part only
    return [[frozenset({i}) if c == i else frozenset() for c in range(n)] for i in range(n)]


def states(op: str, n: int) -> list[list[list[frozenset[int]]]]:
    """The buffers before the first step and after each step: ``len(ring_steps(op, n)) + 1`` states.

    Within a step every rank sends what it held at the start of the step (the sends happen at once).
    """
    current = initial_state(op, n)
    history = [current]
    for step in ring_steps(op, n):
        nxt = [row[:] for row in current]
        for t in step:
            if op == "all_to_all":  # the receiver files rank src's part in its output slot src
                nxt[t.dst][t.src] = frozenset({t.src})
                continue
            sent = current[t.src][t.chunk]
            nxt[t.dst][t.chunk] = current[t.dst][t.chunk] | sent if t.reduce else sent
        history.append(nxt)
        current = nxt
    return history


def bytes_sent_per_rank(op: str, n: int, payload_bytes: int) -> list[int]:
    """Bytes each rank sends over the whole ``op`` (chunks of S/n, rounded up once at the end)."""
    _check(op, n)
    sent = [Fraction(0)] * n
    for step in ring_steps(op, n):
        for t in step:
            sent[t.src] += Fraction(payload_bytes, n)
    return [-(-s.numerator // s.denominator) for s in sent]
