"""The trusted model of exercise 7's check (placement_3d.py): the rank grid in an order given innermost first
(every group of a dimension, from the course's grid `theory.grid`, and which dimensions keep their groups inside a
node) and what a run draws from its seed (trials.py): the jobs of `groups_inside_node` and the grids of
`build_groups`, drawn until every misreading of the order gets something wrong. Registers no check.

`grids` runs on the ranks too, where the sandbox shows no theory.grid (headless/view.py): it counts the groups
itself (`_groups`). Only the trusted side reaches theory.grid, lazily, through `expected_groups`.
"""
from __future__ import annotations

import functools
import itertools

from partrain_edu.grading.trials import stream

DIMS = ("tp", "dp", "pp")  # the order every rank all-reduces over its groups in
ORDERS = tuple("-".join(p) for p in itertools.permutations(DIMS))   # innermost first
MEGATRON = "tp-dp-pp"      # Megatron-Core's default (tp-cp-ep-dp-pp without cp, ep)
PICOTRON = "tp-pp-dp"      # picotron's grid (dp, pp, cp, tp): dp outermost
NODES = (4, 8, 8, 8, 16, 72)   # GPUs per node: 8 most often; 72: a GB200 NVL72 domain as one "node"
SIZES = {"tp": (1, 2, 4, 8, 16), "dp": (1, 2, 3, 4, 6, 8, 9, 12, 16), "pp": (1, 2, 4, 8, 16)}
JOBS = 10


def expected_groups(dim: str, dp: int, tp: int, pp: int, order: str = MEGATRON) -> list[list[int]]:
    """Every group along `dim`, sorted, from the course's rank grid in `order` (innermost first)."""
    return [list(g) for g in _grid_groups(dim, dp, tp, pp, order)]


@functools.lru_cache(maxsize=4096)   # verdicts ask for the same groups once per rank, dimension and order
def _grid_groups(dim: str, dp: int, tp: int, pp: int, order: str) -> tuple[tuple[int, ...], ...]:
    from partrain_edu.theory import grid  # the reference, in the grader only: the sandbox shows no grid

    return tuple(map(tuple, grid.group_ranks(dim, {"pp": pp, "dp": dp, "tp": tp},
                                             order=tuple(reversed(order.split("-"))))))


def inside_node(dp: int, tp: int, pp: int, gpus_per_node: int, order: str = MEGATRON) -> dict[str, bool]:
    """{dim: every group of dim has all its ranks on one node}, node k holding ranks k·g .. (k+1)·g − 1."""
    return dict(zip(DIMS, _inside(dp, tp, pp, gpus_per_node, order), strict=True))


@functools.lru_cache(maxsize=4096)   # the draw asks again for the same jobs under other readings of the order
def _inside(dp: int, tp: int, pp: int, gpus_per_node: int, order: str) -> tuple[bool, ...]:
    return tuple(all(len({r // gpus_per_node for r in g}) == 1 for g in expected_groups(dim, dp, tp, pp, order))
                 for dim in DIMS)


def dim_size(dim: str, dp: int, tp: int, pp: int) -> int:
    return {"tp": tp, "dp": dp, "pp": pp}[dim]


def _telling(jobs: list[tuple[int, int, int, int, str]]) -> bool:
    """Whether these jobs tell the lesson apart from its misreadings: each dimension inside a node somewhere and
    crossing elsewhere, a group that fits a node by size but crosses, and every fixed order and the reversed
    reading of `order` wrong somewhere."""
    truth = [inside_node(*job) for job in jobs]
    if not all({t[dim] for t in truth} == {True, False} for dim in DIMS):
        return False
    if not any(not t[d] and dim_size(d, *job[:3]) <= job[3] and job[3] % dim_size(d, *job[:3]) == 0
               for t, job in zip(truth, jobs, strict=True) for d in DIMS):
        return False
    readings = [lambda order, fixed=fixed: fixed for fixed in ORDERS] + [lambda order: reversed_order(order)]
    return all(any(inside_node(*job[:4], reading(job[4])) != t for t, job in zip(truth, jobs, strict=True))
               for reading in readings)


def reversed_order(order: str) -> str:
    return "-".join(reversed(order.split("-")))


def node_jobs(seed: int) -> list[tuple[int, int, int, int, str]]:
    """The run's (dp, tp, pp, gpus_per_node, order): half in Megatron-Core's order, two in picotron's."""
    rng = stream(seed, "groups_inside_node")
    while True:
        jobs = []
        for k in range(JOBS):
            order = MEGATRON if k < JOBS // 2 else PICOTRON if k < JOBS // 2 + 2 else rng.choice(ORDERS)
            jobs.append((rng.choice(SIZES["dp"]), rng.choice(SIZES["tp"]), rng.choice(SIZES["pp"]),
                         rng.choice(NODES), order))
        if _telling(jobs):
            rng.shuffle(jobs)
            return jobs


# --- build_groups on 8 ranks ------------------------------------------------------------------------------

NPROC, GRIDS = 8, 3
FACTORS = [(dp, tp, 8 // (dp * tp)) for dp in (1, 2, 4, 8) for tp in (1, 2, 4, 8) if 8 % (dp * tp) == 0]


def _swap(order: str, a: str, b: str) -> str:
    return "-".join({a: b, b: a}.get(d, d) for d in order.split("-"))


# How an answer can misread a grid (dp, tp, pp, order): a fixed order, `order` read outermost first, two
# dimensions swapped in the order, or two sizes swapped. The run's grids must catch each of them somewhere.
MISREADINGS = ([lambda dp, tp, pp, order, fixed=fixed: (dp, tp, pp, fixed) for fixed in ORDERS]
               + [lambda dp, tp, pp, order: (dp, tp, pp, reversed_order(order))]
               + [lambda dp, tp, pp, order, a=a, b=b: (dp, tp, pp, _swap(order, a, b))
                  for a, b in itertools.combinations(DIMS, 2)]
               + [lambda dp, tp, pp, order: (tp, dp, pp, order), lambda dp, tp, pp, order: (pp, tp, dp, order),
                  lambda dp, tp, pp, order: (dp, pp, tp, order)])


def _groups(dp: int, tp: int, pp: int, order: str) -> list[set[tuple[int, ...]]]:
    """Every group of tp, dp, pp in `order`, for the draw only: it runs on the ranks too, where the sandbox has no
    theory.grid (the verdicts use theory.grid, in the caller)."""
    size, out = {"tp": tp, "dp": dp, "pp": pp}, []
    coords = []
    for rank in range(dp * tp * pp):
        c, rest = {}, rank
        for dim in order.split("-"):   # innermost first
            c[dim], rest = rest % size[dim], rest // size[dim]
        coords.append(c)
    for dim in DIMS:
        by_rest: dict[tuple, list[int]] = {}
        for rank, c in enumerate(coords):
            by_rest.setdefault(tuple(c[d] for d in DIMS if d != dim), []).append(rank)
        out.append({tuple(g) for g in by_rest.values()})
    return out


def grids(seed: int) -> list[tuple[int, int, int, str]]:
    """The run's (dp, tp, pp, order): 3 of the 10 factorisations of 8, each in an order drawn from all six, such
    that every misreading (MISREADINGS) gets some group of some grid wrong."""
    rng = stream(seed, "build_groups")
    while True:
        drawn = [(*sizes, rng.choice(ORDERS)) for sizes in rng.sample(FACTORS, GRIDS)]
        truth = [_groups(*grid) for grid in drawn]
        if all(any(_groups(*misread(*grid)) != t for grid, t in zip(drawn, truth, strict=True))
               for misread in MISREADINGS):
            return drawn

