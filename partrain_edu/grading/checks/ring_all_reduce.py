"""Exercise 01, a ring all-reduce (环形全归约) from isend/irecv, graded on 4 ranks in rounds drawn per run: three on
the default group (group=None), then three on each of two partitions of the ranks into groups that run at once —
one into 3 + 1 ranks, one into 2 + 2 (so a group that does not start at rank 0 is always among them). Every rank
calls `dist.new_group` for every group, member or not. A round's tensor length is drawn per run: one shorter than
the group, one its size does not divide, one it divides (the groups of a round share it).

Graded per rank and round, the earliest failing round told first: the memory of `tensor` — a view into a larger
buffer — holds the sum over the group's ranks afterwards (the sum is made in place; a returned tensor counts for
nothing); no collective is called; a rank sends only to its right neighbour in the group and receives only from
its left; it sends exactly the ring's 2(n−1)/n·S bytes (parallel.ring.ring_bytes_sent_by). Element i of global
rank r's input is 2^r + 16·(i + c_r), c_r drawn per round and rank (notebook 01's 2^r trick; no rank can tell
another's input from its own), so a wrong element is read back as the set of ranks it summed and where it came
from — a sum that holds ranks outside the group says the group was ignored.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import Problem, register
from partrain_edu.grading.trials import partitions, stream
from partrain_edu.parallel.ring import chunk_bounds, ring_bytes_sent_by

RANKS = 4
RING_TAG = 2 ** RANKS  # > 2^0 + … + 2^3: the low bits of a sum say which ranks it holds
OFFSETS = 100          # c_r < OFFSETS: every value stays a whole number far below float32's 2^24
COLLECTIVES = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "reduce_scatter_single",
               "all_gather_single", "_all_gather_base", "_reduce_scatter_base", "all_reduce_coalesced",
               "all_gather_coalesced", "gather", "scatter"}


@dataclass(frozen=True)
class Round:
    groups: tuple[tuple[int, ...], ...]  # the partition: each group's global ranks, ascending (= group-rank order)
    numel: int
    offsets: tuple[int, ...]             # c_r of every global rank

    def group_of(self, rank: int) -> tuple[int, ...]:
        return next(g for g in self.groups if rank in g)


def rounds(seed: int) -> list[Round]:
    """The run's rounds: the default group, then a 3 + 1 and a 2 + 2 partition, three tensor lengths each."""
    rng = stream(seed, "ring_all_reduce")
    out = []
    for groups in partitions(rng, RANKS):
        n = max(len(g) for g in groups)
        lengths = [rng.randrange(1, n), n * rng.randrange(1, 5) + rng.randrange(1, n), n * rng.randrange(1, 6)]
        rng.shuffle(lengths)  # shorter than the group, not divisible, divisible: in an order no one can expect
        out += [Round(groups, numel, tuple(rng.randrange(OFFSETS) for _ in range(RANKS))) for numel in lengths]
    return out


def ring_input(numel: int, rank: int, offset: int = 0) -> torch.Tensor:
    """Element i of global rank r is 2^r + 16·(i + c_r) (notebook 01's 2^r trick): a sum over the ranks S at
    position i is Σ_{r∈S} 2^r + 16·(|S|·i + Σ c_r), so a wrong element tells which ranks it summed, and where."""
    return 2.0 ** rank + RING_TAG * (torch.arange(numel, dtype=torch.float32) + offset)


def inputs(rnd: Round) -> dict[int, torch.Tensor]:
    """Every global rank's input in round `rnd`, in float64 (every rank has one: each is in some group)."""
    return {r: ring_input(rnd.numel, r, rnd.offsets[r]).double() for r in range(RANKS)}


def observe(ctx, ring_all_reduce, *, seed: int) -> list[dict]:
    plan = rounds(seed)
    groups = {plan[0].groups[0]: None}  # the default group is passed as group=None
    for rnd in plan:
        for members in rnd.groups:
            if members not in groups:  # every rank makes every group, in the same order, member or not
                groups[members] = dist.new_group(list(members))
    dist.barrier()  # every group connected on every rank before the learner's code runs (and may exit)
    seen = []
    for rnd in plan:
        buffer = torch.full((rnd.numel + 2,), -1.0)  # `tensor` is a view into it: the sum must land in this memory
        buffer[1:-1] = ring_input(rnd.numel, ctx.rank, rnd.offsets[ctx.rank])
        with CommTracer() as tracer:
            returned = ring_all_reduce(buffer[1:-1], groups[rnd.group_of(ctx.rank)])
        seen.append({"out": tensor(buffer[1:-1]), "returned": tensor(returned), **traffic(tracer)})
    return seen


@register("ring_all_reduce", nproc=RANKS, observe=observe, given={"chunk_bounds": chunk_bounds},
          summary="on 4 ranks, on the default group and on sub-groups of 1 to 3 ranks, with tensor lengths drawn "
          "per run (shorter than the group, not divisible by its size, divisible), every rank's tensor holds the "
          "sum dist.all_reduce gives, made in place, and each rank sent exactly the ring's 2(n−1)/n·S bytes, "
          "point-to-point only, to its right neighbour only",
          deadlock_hint="Likely: every rank posts a blocking recv (or send) first, so all wait for a message "
          "nobody sends — post the receive with irecv and the send with isend, then wait on both; or, on a "
          "sub-group, a rank waits for a rank outside the group (take n and the rank's place from "
          "dist.get_world_size(group) and dist.get_rank(group), and pass group= to every call).",
          mismatch_hint="Likely: a rank sends to its left neighbour or receives from its right one (in a ring "
          "each rank sends to its right neighbour and receives from its left), or two ranks cut the tensor at "
          "different chunk bounds (every rank must use the same chunk_bounds(numel, n), n the group's size).")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    plan = rounds(seed)
    for k, (rnd, run) in enumerate(zip(plan, observed.items(len(plan)), strict=True)):
        problem = judge(rnd, me, run)
        if problem:
            return [Problem(problem, at=(k,))]
    return []


def where(rnd: Round, me: int) -> str:
    members = rnd.group_of(me)
    if len(members) == RANKS:
        return f"length {rnd.numel} on the default group ({RANKS} ranks)"
    return f"length {rnd.numel} on the group of rank(s) {list(members)}"


SCHEDULE = (" Hint: group rank g sends chunk (g − s − 1) mod n and adds the one it receives in reduce-scatter step "
            "s, then forwards chunk (g − s) mod n in all-gather step s; chunk boundaries must match on every rank "
            "(first numel % n chunks one longer).")


def judge(rnd: Round, me: int, run: Reader) -> str | None:
    """The first problem of rank `me`'s call in round `rnd`: the sum, in place; no collective; the peers; bytes."""
    members, given = rnd.group_of(me), inputs(rnd)
    expected = sum(given[r] for r in members)
    got, label = run["out"].tensor(), where(rnd, me)
    problem = differ(label, expected, got)
    if problem:
        if isinstance(got, torch.Tensor) and torch.equal(got, given[me]):
            returned = run["returned"].tensor()
            if isinstance(returned, torch.Tensor) and differ("", expected, returned) is None:
                return (f"{label}: `tensor` still holds this rank's input after your function returned — the sum "
                        "came back in a new tensor instead. The all-reduce is in place, as dist.all_reduce: the sum "
                        "must be written into `tensor` itself (its chunks are views of it), not into a new tensor.")
            return (f"{label}: `tensor` still holds this rank's input after your function returned: nothing was "
                    f"summed into it (the sum is made in place, in `tensor` itself).{SCHEDULE}")
        diagnosis, named = ring_diagnosis(expected, got, given, me, members)
        return problem + diagnosis + ("" if named else SCHEDULE)
    used = sorted(set(run["ops"].counts()) & COLLECTIVES)
    if used:
        return f"{label}: you called {used}; build the all-reduce from isend/irecv (send/recv) only"
    peers = {op: set(run["peers"][op].numbers()) for op in run["peers"].keys()}
    g, size = members.index(me), len(members)
    right, left = members[(g + 1) % size], members[(g - 1) % size]
    sent_to = peers.get("isend", set()) | peers.get("send", set())
    heard_from = peers.get("irecv", set()) | peers.get("recv", set())
    if not sent_to <= {right} or not heard_from <= {left}:
        return (f"{label}: rank {me} sent to rank(s) {sorted(sent_to)} and received from {sorted(heard_from)}; in a "
                f"ring each rank sends only to its right neighbour in the group (rank {right}) and receives only "
                f"from its left (rank {left}) — every link carries 1/n of the tensor per step")
    want, sent = ring_bytes_sent_by(g, rnd.numel, 4, size), run["sent"].count()
    if sent != want:
        return (f"{label}: sent {sent} bytes, the ring sends exactly {want} (2(n−1)/n·S with S = {rnd.numel * 4} B "
                "and n the group's size: every chunk but one per phase). "
                + ("More means whole tensors or extra chunks travel." if sent > want else
                   "Less means some chunk never travelled."))
    return None


def decode_ring_sum(value: float, given: dict[int, torch.Tensor]) -> tuple[set[int], int] | None:
    """(the ranks, the position) of the sum of the ranks' inputs `given` (ring_input) that `value` is, or None when
    it is no such sum (tagged bits of a rank not in `given`, or no position of theirs adds up to it)."""
    if value != int(value) or value <= 0:
        return None
    bits = int(value) % RING_TAG
    ranks = {r for r in range(RANKS) if bits >> r & 1}
    if not ranks or not ranks <= set(given):
        return None
    hits = (sum(given[r] for r in ranks) == value).nonzero().reshape(-1)
    return (ranks, int(hits[0])) if hits.numel() else None


def ring_diagnosis(expected: torch.Tensor, got, given: dict[int, torch.Tensor], me: int,
                   members: tuple[int, ...] | None = None) -> tuple[str, bool]:
    """What the first wrong element holds, and whether that names the cause (a scaled input; ranks from outside
    the group `members`, default: every rank of `given`). The element is read as the sum of a set of the ranks'
    inputs `given` (global rank -> input, their 2^r tags: ring_input) at one position when it is one; otherwise it
    is said to be no such sum: a ring only adds and moves chunks, so something else changed it."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return ".", False
    members = tuple(given) if members is None else members
    got, expected = got.double().reshape(-1), expected.double().reshape(-1)
    wrongs = [i for i in range(got.numel()) if abs(got[i] - expected[i]) > 1e-4]
    if not wrongs:
        return ".", False
    wrong = wrongs[0]
    value, want = float(got[wrong]), float(expected[wrong])
    decoded = decode_ring_sum(value, given)
    # Every wrong element a sum of the ranks' inputs: that story holds everywhere (a ring only adds and moves).
    # Otherwise a tensor that is k × this rank's input is told as scaled, though an element may decode by chance;
    # one element is a multiple of anything, so only a longer tensor shows it.
    summed = all(decode_ring_sum(float(got[i]), given) is not None for i in wrongs)
    scale = ratio_of(given[me].double().reshape(-1), got) if not summed and got.numel() > 1 else None
    if scale is not None and abs(scale - 1) > 1e-3:
        return (f". Element {wrong} holds {value:g}, which is no sum of the ranks' inputs (expected {want:g}): every "
                f"element is {scale:g}× this rank's own input — each element must be added to the other ranks' "
                "values, not scaled.", True)
    if decoded is None:
        return (f". Element {wrong} holds {value:g}, which is no sum of the ranks' inputs (expected {want:g}): a "
                "ring only adds received chunks and copies them, so something else changed this value.", False)
    ranks, position = decoded
    outside = sorted(ranks - set(members))
    if outside:
        return (f". Element {wrong} holds the sum of rank(s) {sorted(ranks)}, but rank(s) {outside} are not in this "
                f"group {list(members)}: the call ran on other ranks than `group`'s — take n and this rank's place "
                "from the group (dist.get_world_size(group), dist.get_rank(group)) and pass group= to every "
                "send and receive.", True)
    missing = sorted(set(members) - ranks)
    return (f". Element {wrong} holds the sum of rank(s) {sorted(ranks)}"
            + (f" (rank(s) {missing} never added)" if missing else "")
            + (f" of element {position}: a chunk landed in the wrong place" if position != wrong else "")
            + ".", False)
