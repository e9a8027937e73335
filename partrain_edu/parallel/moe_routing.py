"""Top-k routing with a capacity factor and the Switch load-balancing loss: which expert each token goes to,
which assignments are dropped, and the loss that evens the load. One group of N tokens (one rank's) at a time.

    g = softmax(x · W_r)  (N, E);  top-k gates ĝ (renormalised to sum to 1 when k > 1, GShard)
    C = ⌈capacity_factor · N·k / E⌉ (theory.moe.capacity); an expert takes its first C assignments,
        all first choices before any second choice (GShard §2.2), tokens in order; the rest are dropped:
        their gate is 0, so a token dropped by all its experts leaves the layer as 0 and keeps its residual
    aux = α · E · Σ_i f_i · P_i (Switch Transformer eq. 4; f_i counted before capacity, P_i = mean g_i)

The loss is returned, not added: the caller adds it to its own (`loss = task + routing.aux_loss`).
Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch Transformer).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.theory.moe import capacity


@dataclass
class Routing:
    weights: torch.Tensor    # (N, k) gate of each assignment, 0 where it was dropped
    experts: torch.Tensor    # (N, k) expert id of each assignment
    kept: torch.Tensor       # (N, k) bool: within its expert's capacity
    load: torch.Tensor       # (E,) assignments routed to each expert, before capacity
    aux_loss: torch.Tensor   # () α·E·Σ f_i P_i, in the graph (its gradient reaches the router through P)
    capacity: int | None     # C, or None when dropless

    @property
    def dropped(self) -> int:
        return int((~self.kept).sum())

    @property
    def kept_load(self) -> torch.Tensor:   # (E,) rows each expert processes
        return torch.bincount(self.experts[self.kept], minlength=self.load.numel())


def within_capacity(experts: torch.Tensor, n_experts: int, cap: int | None) -> torch.Tensor:
    """(N, k) expert ids → (N, k) bool: the assignments each expert takes, first choices first."""
    if cap is None:
        return torch.ones_like(experts, dtype=torch.bool)
    choice_major = experts.t().reshape(-1)                                   # (k·N,) priority order
    one_hot = F.one_hot(choice_major, n_experts)                             # (k·N, E)
    position = (one_hot.cumsum(0) * one_hot).sum(1) - 1                      # place in its expert's queue
    return (position < cap).view(experts.shape[1], -1).t()                   # (N, k)


def route(router: nn.Module, x: torch.Tensor, k: int, capacity_factor: float | None = None,
          aux_weight: float = 0.01) -> Routing:
    """(N, H) tokens → their Routing. capacity_factor None: dropless (every assignment kept)."""
    gates = F.softmax(router(x), dim=-1)                                     # (N, E)
    n, n_experts = gates.shape
    weights, experts = gates.topk(k, dim=-1)                                 # (N, k), (N, k)
    if k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)               # GShard: the k gates sum to 1
    cap = None if capacity_factor is None else capacity(n, n_experts, k, capacity_factor)
    kept = within_capacity(experts, n_experts, cap)
    load = torch.bincount(experts.reshape(-1), minlength=n_experts)          # (E,)
    f = load.to(gates.dtype) / (n * k)                                       # share of assignments: no gradient
    aux = aux_weight * n_experts * (f * gates.mean(0)).sum()
    return Routing(weights * kept, experts, kept, load, aux, cap)
