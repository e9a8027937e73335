"""The one rank grid of the course: which global rank holds which (pp, dp, [cp,] tp) coordinates.

    coordinates(5, {"pp": 2, "dp": 2, "tp": 2}) == {"pp": 1, "dp": 0, "tp": 1}      r = (s·dp + d)·tp + t
    coordinates(5, {"pp": 1, "dp": 2, "cp": 2, "tp": 2}) == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}

The order is Megatron-LM's (Narayanan et al. 2021, §3; Megatron-Core's default `tp-cp-ep-dp-pp`, innermost
first) and torchtitan's (`pp, dp, tp`): tensor parallelism innermost, so a tp group is tp consecutive ranks —
one node's GPUs, where the per-layer all-reduces of activations need NVLink; data parallelism next; pipeline
stages outermost, so the slowest links (between nodes) carry only the stages' point-to-point activations.
picotron orders its grid (dp, pp, cp, tp), data parallelism outermost: then the dp gradient all-reduce is
what crosses nodes. Context parallelism (cp), when the sizes name it, sits between dp and tp (`ORDER_CP`, Megatron's
tp-cp-dp-pp): its ring passes K/V blocks every layer, next to tp's all-reduces. `order=` gives any other order, for
comparison; everything here is pure Python.
"""
from __future__ import annotations

from typing import Mapping

ORDER = ("pp", "dp", "tp")  # outermost first
ORDER_CP = ("pp", "dp", "cp", "tp")  # the same with context parallelism, used when the sizes name "cp"


def order_of(sizes: Mapping[str, int]) -> tuple[str, ...]:
    """The default order for these sizes: ORDER_CP when they name "cp", else ORDER."""
    return ORDER_CP if "cp" in sizes else ORDER


def _check(sizes: Mapping[str, int], order: tuple[str, ...]) -> None:
    if set(sizes) != set(order):
        raise ValueError(f"sizes must name exactly {', '.join(order)}; got {', '.join(sizes) or 'nothing'}")
    for dim in order:
        if isinstance(sizes[dim], bool) or not isinstance(sizes[dim], int) or sizes[dim] < 1:
            raise ValueError(f"{dim} must be a positive whole number, got {sizes[dim]!r}")


def world_size(sizes: Mapping[str, int]) -> int:
    total = 1
    for n in sizes.values():
        total *= n
    return total


def coordinates(rank: int, sizes: Mapping[str, int], order: tuple[str, ...] | None = None) -> dict[str, int]:
    """Global rank → {dim: coordinate}; the last dimension of `order` varies fastest."""
    order = order or order_of(sizes)
    _check(sizes, order)
    if not 0 <= rank < world_size(sizes):
        raise ValueError(f"rank {rank} is outside a world of {world_size(sizes)} ranks "
                         f"({' × '.join(f'{d}={sizes[d]}' for d in order)})")
    coords = {}
    for dim in reversed(order):
        coords[dim] = rank % sizes[dim]
        rank //= sizes[dim]
    return {dim: coords[dim] for dim in order}


def rank_of(coords: Mapping[str, int], sizes: Mapping[str, int], order: tuple[str, ...] | None = None) -> int:
    """{dim: coordinate} → global rank (the inverse of `coordinates`)."""
    order = order or order_of(sizes)
    _check(sizes, order)
    rank = 0
    for dim in order:
        if not 0 <= coords[dim] < sizes[dim]:
            raise ValueError(f"{dim} coordinate {coords[dim]} is outside 0..{sizes[dim] - 1}")
        rank = rank * sizes[dim] + coords[dim]
    return rank


def group_ranks(dim: str, sizes: Mapping[str, int], order: tuple[str, ...] | None = None) -> list[list[int]]:
    """Every group along `dim`: ranks equal in the other coordinates, each list in order of `dim`'s coordinate,
    the lists sorted by their first rank."""
    order = order or order_of(sizes)
    _check(sizes, order)
    if dim not in order:
        raise ValueError(f"dim must be one of {', '.join(order)}, got {dim!r}")
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(world_size(sizes)):
        c = coordinates(r, sizes, order)
        groups.setdefault(tuple(c[d] for d in order if d != dim), []).append(r)
    return sorted(groups.values())


def block(dim: str, sizes: Mapping[str, int], order: tuple[str, ...] | None = None) -> int:
    """Every group along `dim` lies inside one aligned block of this many consecutive ranks (the sizes of `dim`
    and of every dimension inside it multiplied): when a node holds a whole block, the group talks over the
    node's fast links. ORDER: tp → tp, dp → tp·dp, pp → the whole world; ORDER_CP: cp → tp·cp, dp → tp·cp·dp."""
    order = order or order_of(sizes)
    _check(sizes, order)
    if dim not in order:
        raise ValueError(f"dim must be one of {', '.join(order)}, got {dim!r}")
    return world_size({d: sizes[d] for d in order[order.index(dim):]})
