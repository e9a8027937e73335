"""Exercise 7, 3D placement: which process groups stay inside a node, and building them on real ranks.

`groups_inside_node` (in-process) grades, for 7 jobs, which of tp, dp, pp have every group inside one node.
`build_groups` (8 Gloo ranks) runs the learner's group builder for dp 2 × tp 2 × pp 2 and dp 2 × tp 1 × pp 4
and proves each returned group's members with a collective: every rank all-reduces 2^rank (int64) over it, so
the sum's set bits are exactly the ranks that took part; `dist.get_process_group_ranks` says who the group
claims to hold. The trusted half recomputes the groups from the course's grid (`theory.grid`):

    rank = tp_rank + tp·(dp_rank + dp·pp_rank)     tp innermost, pp outermost (Megatron-Core's order)

so a tp group is tp consecutive ranks, a dp group's ranks are tp apart (a block of tp·dp), a pp group's tp·dp
apart. Why tp goes inside the node: its all-reduces of activations happen in every layer, forward and
backward, and need NVLink's bandwidth; dp's one gradient all-reduce per step and pp's point-to-point
activations tolerate the slower links between nodes (Narayanan et al. 2021, §3; Shoeybi et al. 2019).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from partrain_edu.grading.observations import Reader
from partrain_edu.grading.registry import register

DIMS = ("tp", "dp", "pp")  # innermost first: the order every rank creates and all-reduces its groups in

# (dp, tp, pp, gpus_per_node): the 64-GPU job first, then one where dp fits too, a single node, 4-GPU nodes,
# tp wider than a node, a size-1 dimension, and a 72-GPU NVLink domain (GB200 NVL72) as one "node"
NODE_CASES = [(4, 8, 2, 8), (2, 4, 8, 8), (2, 2, 2, 8), (2, 2, 4, 4), (2, 16, 1, 8), (8, 1, 2, 8), (9, 8, 4, 72)]


def expected_groups(dim: str, dp: int, tp: int, pp: int) -> list[list[int]]:
    """Every group along `dim`, sorted, from the course's one rank grid (pp outermost, tp innermost)."""
    from partrain_edu.theory import grid   # the reference, in the grader only: the sandbox shows no grid

    return grid.group_ranks(dim, {"pp": pp, "dp": dp, "tp": tp})


def inside_node(dp: int, tp: int, pp: int, gpus_per_node: int) -> dict[str, bool]:
    """{dim: every group of dim has all its ranks on one node}, node k holding ranks k·g .. (k+1)·g − 1."""
    return {dim: all(len({r // gpus_per_node for r in g}) == 1 for g in expected_groups(dim, dp, tp, pp))
            for dim in DIMS}


def _placement(dim: str, dp: int, tp: int, pp: int, per_node: int) -> str:
    """Why `dim`'s groups are (or are not) inside a node, from the rank order."""
    groups = expected_groups(dim, dp, tp, pp)
    crossing = [g for g in groups if len({r // per_node for r in g}) > 1]
    group = crossing[0] if crossing else groups[-1]
    nodes = sorted({r // per_node for r in group})
    shown = f"{group[:8]}"[:-1] + (", …]" if len(group) > 8 else "]")
    where = f"spans nodes {nodes}" if crossing else f"is all on node {nodes[0]}"
    span = {"tp": "tp", "dp": "tp·dp", "pp": "tp·dp·pp"}[dim]
    from partrain_edu.theory import grid

    block = grid.block(dim, {"pp": pp, "dp": dp, "tp": tp})
    return (f"e.g. {dim} group {shown} {where}"
            + (" (a dimension of size 1 has one-rank groups)" if len(group) == 1 else "")
            + f". Hint: rank = tp_rank + tp·(dp_rank + dp·pp_rank), so {_stride_text(dim, dp, tp)}: a {dim} group "
            f"stretches over {span} = {block} consecutive ranks, and a node holds {per_node}")


def _stride_text(dim: str, dp: int, tp: int) -> str:
    return {"tp": "tp ranks are adjacent (stride 1)", "dp": f"dp ranks are tp = {tp} apart",
            "pp": f"pp is outermost: pp ranks are tp·dp = {tp * dp} apart"}[dim]


@register("groups_inside_node", summary="which of tp, dp, pp keep every group inside one node matches "
          "Megatron-Core's rank order for 7 jobs, among them 64 GPUs = tp 8 × dp 4 × pp 2 on 8-GPU nodes")
def groups_inside_node_check(groups_inside_node, *, seed: int) -> list[str]:
    for dp, tp, pp, per_node in NODE_CASES:
        where = f"dp={dp}, tp={tp}, pp={pp} on {per_node}-GPU nodes ({dp * tp * pp} GPUs)"
        want, got = inside_node(dp, tp, pp, per_node), groups_inside_node(dp, tp, pp, per_node)
        if not (isinstance(got, dict) and set(got) == set(DIMS) and all(isinstance(v, bool) for v in got.values())):
            return [f"{where}: expected a dict {{'tp': bool, 'dp': bool, 'pp': bool}} (True: every group of that "
                    f"dimension inside one node), got {got!r}"[:400]]
        for dim in DIMS:
            if got[dim] != want[dim]:
                return [f"{where}: {dim} groups expected {'inside one node' if want[dim] else 'crossing nodes'}, "
                        f"got {'inside' if got[dim] else 'crossing'}: {_placement(dim, dp, tp, pp, per_node)}"]
    return []


# --- build_groups on 8 ranks ------------------------------------------------------------------------------

NPROC = 8
GRIDS = [(2, 2, 2), (2, 1, 4)]  # (dp, tp, pp): all three dimensions; then unequal sizes, so none is mistaken


def observe(ctx, build_groups, *, seed: int) -> list[dict]:
    """Per grid: for each of tp, dp, pp, the ranks the returned group claims and the sum of 2^rank over it."""
    runs = []
    for dp, tp, pp in GRIDS:
        groups = build_groups(dp, tp, pp)
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


def group_problem(dim: str, me: int, dp: int, tp: int, pp: int, seen: Reader) -> str | None:
    """What is wrong with rank `me`'s group along `dim`, proven by the all-reduce of 2^rank, or None."""
    n, where = dp * tp * pp, f"dp={dp}, tp={tp}, pp={pp}: your {dim} group on rank {me}"
    if "type" in seen.value:
        what = str(seen["type"].value)[:60]
        tip = (f" — a DeviceMesh: return mesh['{dim}'].get_group()" if what == "DeviceMesh" else
               " — dist.new_group gives -100 (GroupMember.NON_GROUP_MEMBER) to a rank outside the group: return "
               "the group this rank is in" if what == "int" else "")
        return f"{where} is of type {what}, not a ProcessGroup{tip}"
    claimed, total = sorted(seen["ranks"].numbers(n)), seen["sum"].count()
    want = next(g for g in expected_groups(dim, dp, tp, pp) if me in g)
    summed = _members(total)
    if total >= 1 << n or claimed != [r for r in range(n) if total >> r & 1]:
        return (f"{where} claims ranks {claimed} (dist.get_process_group_ranks), but its all-reduce of 2^rank "
                f"summed {total} = bits {bin(total)}, ranks {summed}: the ranks did not build the same groups "
                "— dist.new_group is collective: every rank must call it for every group, also the groups it is "
                "not in, in the same order")
    if claimed == want:
        return None
    message = (f"{where} summed ranks {summed} (bits {bin(total)}); expected {_members(sum(1 << r for r in want))}"
               f": {_stride_text(dim, dp, tp)}")
    other = next((d for d in DIMS if d != dim and claimed in expected_groups(d, dp, tp, pp)), None)
    if other:
        message += (f". {summed} is a {other} group: {dim} and {other} are swapped in your order — innermost "
                    "first it is tp, dp, pp (init_device_mesh takes the shape outermost first: (pp, dp, tp))")
    return message


@register("build_groups", nproc=NPROC, observe=observe, given={"init_device_mesh": init_device_mesh},
          summary="on 8 ranks, for dp 2 × tp 2 × pp 2 and dp 2 × tp 1 × pp 4, "
          "every rank's tp, dp and pp groups hold exactly Megatron-Core's members, proven by an all-reduce of "
          "2^rank over each group",
          deadlock_hint="Likely: the ranks did not create the same groups in the same order. dist.new_group is "
          "collective: every rank must call it for every group, also the groups it is not in, in the same "
          "order (or pass use_local_synchronization=True); and every rank all-reduces over its tp, dp, pp "
          "groups in that order, so a group must have the same members on each of its ranks.")
def build_groups_check(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for (dp, tp, pp), run in zip(GRIDS, observed.items(len(GRIDS))):
        returned = str(run["returned"].value)[:60]
        if returned != "dict":
            return [f"dp={dp}, tp={tp}, pp={pp}: build_groups returned a {returned}; expected a dict "
                    "{'tp': group, 'dp': group, 'pp': group} of this rank's three ProcessGroups"]
        keys = [str(k.value)[:20] for k in run["keys"].entries(8)]
        if sorted(keys) != sorted(DIMS):
            return [f"dp={dp}, tp={tp}, pp={pp}: build_groups returned the keys {keys}; expected exactly "
                    "'tp', 'dp', 'pp'"]
        for dim in DIMS:
            problem = group_problem(dim, me, dp, tp, pp, run["groups"][dim])
            if problem:
                return [problem]
    return []
