"""Exercise 7, 3D placement: which process groups stay inside a node, and building them on real ranks, for a
rank order given as Megatron-Core spells it, innermost first ("tp-dp-pp", its default; picotron's is "tp-pp-dp"):

    order "a-b-c":   rank = a_rank + a·(b_rank + b·c_rank)     "tp-dp-pp": rank = tp_rank + tp·(dp_rank + dp·pp_rank)

so a group of the innermost dimension is a run of consecutive ranks, and a group of any other dimension has its
ranks spaced by the product of the sizes inside it. A node holds consecutive ranks, so the order decides which
groups talk over NVLink and which over the network. Why tp goes innermost: its all-reduces of activations happen
in every layer, forward and backward, and need NVLink's bandwidth; dp's one gradient all-reduce per step and pp's
point-to-point activations tolerate the slower links between nodes (Narayanan et al. 2021, §3).

Every run draws its jobs from its seed (trials.py), so an answer hard-coded to one job, or to one order, fails:
- `groups_inside_node` (in-process): 10 jobs of 4-, 8-, 16-GPU nodes or a 72-GPU NVLink domain, sizes up to 16,
  Megatron-Core's and picotron's orders and the other four, such that every dimension is inside a node in some
  job and crossing in another, a group that fits a node by size crosses one, and every other reading of the
  order (a fixed one, or the string read outermost first) gets some job wrong.
- `build_groups` (8 Gloo ranks, one launch): 3 factorisations dp·tp·pp = 8, each with an order, drawn the same
  way. Each returned group's members are proven with a collective: every rank all-reduces 2^rank (int64) over
  it, so the sum's set bits are exactly the ranks that took part; `dist.get_process_group_ranks` says who the
  group claims to hold. The trusted half recomputes every group from the course's grid (`theory.grid`).

The rank grid and the draws are placement_3d_reference.py's; this module holds the observe half of
`build_groups`, the messages (what separates a group's ranks, what every answer agrees with) and the verdicts.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from partrain_edu.grading.checks.placement_3d_reference import (
    DIMS,
    GRIDS,
    MEGATRON,
    NPROC,
    ORDERS,
    dim_size,
    expected_groups,
    grids,
    inside_node,
    node_jobs,
    reversed_order,
)
from partrain_edu.grading.observations import Reader
from partrain_edu.grading.registry import register


def _stride(dim: str, dp: int, tp: int, pp: int, order: str) -> tuple[str, int]:
    """("tp·dp", 8): what separates neighbouring ranks of a `dim` group, in words and as a number."""
    inner = order.split("-")[:order.split("-").index(dim)]
    return "·".join(inner) or "1", math.prod(dim_size(d, dp, tp, pp) for d in inner)


def rank_formula(order: str) -> str:
    a, b, c = order.split("-")
    return f"rank = {a}_rank + {a}·({b}_rank + {b}·{c}_rank)"


def spacing(dim: str, dp: int, tp: int, pp: int, order: str) -> str:
    words, stride = _stride(dim, dp, tp, pp, order)
    if stride == 1 and words == "1":
        return f"{dim} is innermost: {dim} ranks are adjacent (stride 1)"
    return f"{dim} ranks are {words} = {stride} apart"


def _listed(values: list[int], most: int = 8) -> str:
    return "[" + ", ".join(map(str, values[:most])) + (", …]" if len(values) > most else "]")


def _placement(dim: str, dp: int, tp: int, pp: int, per_node: int, order: str) -> str:
    """Why `dim`'s groups are (or are not) inside a node, from the rank order."""
    groups = expected_groups(dim, dp, tp, pp, order)
    crossing = [g for g in groups if len({r // per_node for r in g}) > 1]
    group = crossing[0] if crossing else groups[-1]
    nodes = sorted({r // per_node for r in group})
    where = f"spans nodes {_listed(nodes)}" if crossing else f"is all on node {nodes[0]}"
    words, stride = _stride(dim, dp, tp, pp, order)
    span = f"{words}·{dim}" if words != "1" else dim
    return (f"e.g. {dim} group {_listed(group)} {where}"
            + (" (a dimension of size 1 has one-rank groups)" if len(group) == 1 else "")
            + f". Hint: in order '{order}' (innermost first) {rank_formula(order)}, so "
            f"{spacing(dim, dp, tp, pp, order)}: a {dim} group stretches over {span} = "
            f"{stride * dim_size(dim, dp, tp, pp)} consecutive ranks, and a node holds {per_node}")


def _reading(answers: list, jobs: list) -> str:
    """What every one of the learner's answers agrees with, when it is a misreading (else "")."""
    if all(got == {d: dim_size(d, *job[:3]) <= job[3] for d in DIMS} for got, job in zip(answers, jobs, strict=True)):
        return (" Your answers are 'size ≤ gpus_per_node' in every job: a group small enough for a node still "
                "crosses one when its ranks are spread out.")
    if all(got == inside_node(*job[:4], reversed_order(job[4])) for got, job in zip(answers, jobs, strict=True)):
        return " Your answers read every order outermost first in every job: `order` lists the innermost first."
    fixed = [o for o in ORDERS if all(got == inside_node(*job[:4], o) for got, job in zip(answers, jobs, strict=True))]
    if fixed:
        return f" Your answers follow the order '{fixed[0]}' in every job, whatever `order` says."
    return ""


def _form(got) -> bool:
    return isinstance(got, dict) and set(got) == set(DIMS) and all(isinstance(v, bool) for v in got.values())


@register("groups_inside_node", summary="which of tp, dp, pp keep every group inside one node matches the rank "
          "order for 10 jobs drawn per run: 4- to 72-GPU nodes, Megatron-Core's, picotron's and other orders")
def groups_inside_node_check(groups_inside_node, *, seed: int) -> list[str]:
    jobs, answers = node_jobs(seed), []
    for job in jobs:   # every answer first: what they have in common is the evidence for a hint
        got = groups_inside_node(*job)
        if not _form(got):
            return [f"{_job_call(*job)}: expected a dict {{'tp': bool, 'dp': bool, 'pp': bool}} (True: every group "
                    f"of that dimension inside one node), got {got!r}"[:400]]
        answers.append(got)
    for got, job in zip(answers, jobs, strict=True):
        want = inside_node(*job)
        for dim in DIMS:
            if got[dim] != want[dim]:
                expected = "inside one node" if want[dim] else "crossing nodes"
                return [f"{_job_call(*job)}: {dim} groups expected {expected}, got "
                        f"{'inside' if got[dim] else 'crossing'}: {_placement(dim, *job)}." + _reading(answers, jobs)]
    return []


def _job_call(dp: int, tp: int, pp: int, per_node: int, order: str) -> str:
    return (f"groups_inside_node({dp}, {tp}, {pp}, {per_node}, {order!r}) (dp={dp}, tp={tp}, pp={pp} in order "
            f"'{order}' on {per_node}-GPU nodes, {dp * tp * pp} GPUs)")


# --- build_groups on 8 ranks ------------------------------------------------------------------------------

def observe(ctx, build_groups, *, seed: int) -> list[dict]:
    """Per grid: for each of tp, dp, pp, the ranks the returned group claims and the sum of 2^rank over it."""
    runs = []
    for dp, tp, pp, order in grids(seed):
        groups = build_groups(dp, tp, pp, order)
        if not isinstance(groups, dict):
            runs.append({"returned": type(groups).__name__})
            continue
        seen = {}
        for dim in DIMS:  # the same order on every rank: each all-reduce is collective over its group
            group = groups.get(dim)
            if not isinstance(group, dist.ProcessGroup):
                seen[dim] = {"type": type(group).__name__}
                continue
            bits = torch.tensor([1 << ctx.rank], dtype=torch.int64)
            dist.all_reduce(bits, group=group)
            seen[dim] = {"ranks": dist.get_process_group_ranks(group), "sum": int(bits.item())}
        runs.append({"returned": "dict", "keys": sorted(map(str, groups))[:8], "groups": seen})
    return runs


def _members(bits: int) -> str:
    return "{" + ", ".join(str(r) for r in range(bits.bit_length()) if bits >> r & 1) + "}"


def group_problem(dim: str, me: int, dp: int, tp: int, pp: int, order: str, seen: Reader) -> str | None:
    """What is wrong with rank `me`'s group along `dim`, proven by the all-reduce of 2^rank, or None."""
    n, where = dp * tp * pp, f"dp={dp}, tp={tp}, pp={pp}, order '{order}': your {dim} group on rank {me}"
    if "type" in seen.value:
        what = str(seen["type"].value)[:60]
        tip = (f" — a DeviceMesh: return mesh['{dim}'].get_group()" if what == "DeviceMesh" else
               " — dist.new_group gives -100 (GroupMember.NON_GROUP_MEMBER) to a rank outside the group: return "
               "the group this rank is in" if what == "int" else "")
        return f"{where} is of type {what}, not a ProcessGroup{tip}"
    claimed, total = sorted(seen["ranks"].numbers(n)), seen["sum"].count()
    want = next(g for g in expected_groups(dim, dp, tp, pp, order) if me in g)
    summed = _members(total)
    if total >= 1 << n or claimed != [r for r in range(n) if total >> r & 1]:
        return (f"{where} claims ranks {claimed} (dist.get_process_group_ranks), but its all-reduce of 2^rank "
                f"summed {total} = bits {bin(total)}, ranks {summed}: the ranks did not build the same groups "
                "— dist.new_group is collective: every rank must call it for every group, also the groups it is "
                "not in, in the same order")
    if claimed == want:
        return None
    message = (f"{where} summed ranks {summed} (bits {bin(total)}); expected {_members(sum(1 << r for r in want))}"
               f": in this order {spacing(dim, dp, tp, pp, order)}")
    read = [o for o in (MEGATRON, reversed_order(order), *ORDERS) if o != order and claimed in
            expected_groups(dim, dp, tp, pp, o)]
    other = next((d for d in DIMS if d != dim and claimed in expected_groups(d, dp, tp, pp, order)), None)
    if read:   # another order explains the whole group: say which (the shape of init_device_mesh, too)
        outer_first = ", ".join(reversed(order.split("-")))
        return (f"{message}. {summed} is rank {me}'s {dim} group in the order '{read[0]}' — `order` lists the "
                f"innermost dimension first; init_device_mesh takes the shape outermost first: ({outer_first})")
    if other:
        return (f"{message}. {summed} is rank {me}'s {other} group: are {dim} and {other} swapped (their sizes, or "
                "their places in the order)?")
    return message


@register("build_groups", nproc=NPROC, observe=observe, given={"init_device_mesh": init_device_mesh},
          summary="on 8 ranks, for 3 factorisations dp·tp·pp = 8 and rank orders drawn per run, every rank's tp, dp "
          "and pp groups hold exactly the order's members, proven by an all-reduce of 2^rank over each group",
          deadlock_hint="Likely: the ranks did not create the same groups in the same order. dist.new_group is "
          "collective: every rank must call it for every group, also the groups it is not in, in the same "
          "order (or pass use_local_synchronization=True); and every rank all-reduces over its tp, dp, pp "
          "groups in that order, so a group must have the same members on each of its ranks.")
def build_groups_check(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for (dp, tp, pp, order), run in zip(grids(seed), observed.items(GRIDS), strict=True):
        call = f"build_groups({dp}, {tp}, {pp}, {order!r})"
        returned = str(run["returned"].value)[:60]
        if returned != "dict":
            return [f"{call} returned a {returned}; expected a dict {{'tp': group, 'dp': group, 'pp': group}} of "
                    "this rank's three ProcessGroups"]
        keys = [str(k.value)[:20] for k in run["keys"].entries(8)]
        if sorted(keys) != sorted(DIMS):
            return [f"{call} returned the keys {keys}; expected exactly 'tp', 'dp', 'pp'"]
        for dim in DIMS:
            problem = group_problem(dim, me, dp, tp, pp, order, run["groups"][dim])
            if problem:
                return [problem]
    return []
