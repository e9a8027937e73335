"""Mixture-of-experts by the formula: capacity, dropped tokens, the load-balancing loss, all-to-all bytes.

    C = ⌈capacity_factor · N·k / E⌉       rows one group of N tokens may send to each of E experts (top-k)
    aux = α · E · Σ_i f_i · P_i             f_i: share of the N·k assignments routed to expert i,
                                            P_i: mean gate probability of expert i (Switch Transformer, eq. 4)
    imbalance = max_i load_i / mean_i load_i     1 when balanced; the busiest expert sets the step's pace
    all-to-all bytes a rank sends = rows whose expert lives on another rank · H · element size
    capacity-padded (GShard on TPUs): (n−1)/n · E·C · H · element size, whatever the router does

Expert parallelism composed with data parallelism (GShard; DeepSpeed-MoE): ranks r = d·ep + e, expert-parallel
groups of ep consecutive ranks hold one copy of the experts between them; the ranks with the same e form the
experts' data-parallel group; the non-expert parameters are data parallel over all ranks.
Shazeer et al. 2017; Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch Transformer). Pure Python.
"""
from __future__ import annotations

import math


def _positive(**values: int) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive whole number, got {v!r}")


def capacity(tokens: int, experts: int, k: int, capacity_factor: float) -> int:
    """C = ⌈capacity_factor · tokens·k / experts⌉: the most rows one group may send to one expert."""
    _positive(tokens=tokens, experts=experts, k=k)
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0 (1.0: exactly balanced; 1.25: Switch's default), "
                         f"got {capacity_factor!r}")
    return math.ceil(round(capacity_factor * tokens * k / experts, 9))   # round: 1.1·40/4 is 11, not 11.000…02


def kept_rows(load: list[int], cap: int | None) -> list[int]:
    """Rows each expert processes from one group: its load, cut at the capacity (None: dropless)."""
    return list(load) if cap is None else [min(c, cap) for c in load]


def dropped(load: list[int], cap: int | None) -> int:
    """Assignments over capacity: their rows are not sent, the token keeps only its residual."""
    return sum(load) - sum(kept_rows(load, cap))


def switch_aux_loss(f: list[float], P: list[float], alpha: float = 0.01) -> float:
    """α · E · Σ f_i · P_i (Switch eq. 4). Equals α whenever P is uniform (1/E each), whatever the loads f: its value
    does not measure balance (read f, or `imbalance`); its gradient α·E·f_i does the balancing."""
    if len(f) != len(P) or not f:
        raise ValueError(f"f and P need one entry per expert, got {len(f)} and {len(P)}")
    return alpha * len(f) * sum(a * b for a, b in zip(f, P, strict=True))


def imbalance(load: list[int]) -> float:
    """max load / mean load over experts (or ranks): how much longer the busiest one takes than the average."""
    if not load or sum(load) <= 0:
        raise ValueError("imbalance needs at least one expert with a positive load")
    return max(load) * len(load) / sum(load)


def dispatch_bytes(rows_sent: list[int], rank: int, hidden: int, element_size: int = 4) -> int:
    """Bytes `rank` sends in one exact-count dispatch (or combine): the rows whose expert lives on another rank."""
    return (sum(rows_sent) - rows_sent[rank]) * hidden * element_size


def padded_dispatch_bytes(ranks: int, experts: int, cap: int, hidden: int, element_size: int = 4) -> int:
    """Bytes a rank sends in one capacity-padded all-to-all: E·C slots of H, all but its own experts' share."""
    _positive(ranks=ranks, experts=experts, cap=cap, hidden=hidden)
    return (ranks - 1) * (experts // ranks) * cap * hidden * element_size


def balanced_dispatch_bytes(ranks: int, tokens: int, k: int, hidden: int, element_size: int = 4) -> int:
    """The exact-count dispatch under perfectly even routing: (n−1)/n · N·k · H · element size."""
    return (ranks - 1) * tokens * k * hidden * element_size // ranks


def ep_dp_groups(world: int, ep: int) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert data-parallel groups) for ranks r = d·ep + e: ep innermost, as in
    Megatron-Core's order tp-cp-ep-dp-pp, so an expert-parallel group is ep neighbouring ranks (one node)."""
    _positive(world=world, ep=ep)
    if world % ep:
        raise ValueError(f"ep={ep} does not divide world={world}: pick ep from the divisors of {world}")
    ep_groups = [list(range(d * ep, (d + 1) * ep)) for d in range(world // ep)]
    dp_groups = [list(range(e, world, ep)) for e in range(ep)]
    return ep_groups, dp_groups
