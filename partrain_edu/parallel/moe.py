"""Expert parallelism (专家并行, EP): a mixture-of-experts layer whose experts live on different ranks.

    y = Σ_{e ∈ topk(g)} ĝ_e · expert_e(x), routing with a capacity factor and aux loss (moe_routing.py)
    (a layer, not a `train` strategy: notebooks 07 and 14 and tests/test_moe.py run it under torchrun)

**Sharded**: experts; rank r of an expert-parallel group of n holds experts [r·E/n, (r+1)·E/n) and routes
its own tokens (capacity per rank, GShard's groups). The router is replicated. Composed with data
parallelism (GShard, DeepSpeed-MoE): `expert_parallel_groups(ep)`, then `average_gradients` all-reduces
the experts' gradients over their data-parallel group and the router's over all ranks.
**Sent** (GShard §3.2), exact-count buffers: counts (E ints), dispatch (each kept row, H floats, to its
expert's rank), combine (back); backward sends the same rows again. A rank sends theory.moe.dispatch_bytes
= rows routed away · H · 4 per all-to-all: imbalance shows in the bytes, dropless needs no padding. GShard
pads every buffer to E·C rows for TPUs' static shapes (theory.moe.padded_dispatch_bytes).
Shazeer et al. 2017; Lepikhin et al. 2020 (GShard); Fedus et al. 2021 (Switch Transformer).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.parallel.buckets import Bucket, allreduce_mean
from partrain_edu.parallel.moe_routing import Routing, route
from partrain_edu.theory.moe import dispatch_bytes, ep_dp_groups

__all__ = ["MoE", "ExpertParallelMoE", "Routing", "route", "dispatch_bytes", "expert_parallel_groups",
           "average_gradients"]


def run_experts(experts: nn.ModuleList, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """(R, H) rows, (R,) local expert id per row → (R, H): each row through its own expert."""
    out = rows * 0               # not zeros_like: an edge to `rows` even when no row is here (see _AllToAll)
    for e, expert in enumerate(experts):
        idx = (expert_of_row == e).nonzero().squeeze(1)         # (R_e,) rows for expert e
        if idx.numel():
            out = out.index_copy(0, idx, expert(rows[idx]))      # out of place: autograd sees each expert
    return out


def combine(weights: torch.Tensor, expert_out: torch.Tensor) -> torch.Tensor:
    """(N, k) gates and (N·k, H) expert outputs, token-major → (N, H) gate-weighted sum."""
    n, k = weights.shape
    return (weights.unsqueeze(-1) * expert_out.view(n, k, -1)).sum(dim=1)


def _kept_rows(x: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Index (R,) of the kept assignments in token-major order, their rows (R, H) and expert ids (R,)."""
    kept = routing.kept.reshape(-1).nonzero().squeeze(1)
    return kept, x.repeat_interleave(routing.weights.shape[1], dim=0)[kept], routing.experts.reshape(-1)[kept]


def _scatter_back(n_rows: int, kept: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """(R, H) outputs of the kept assignments → (N·k, H), zeros for the dropped ones."""
    return out.new_zeros((n_rows, out.shape[1])).index_copy(0, kept, out)


class MoE(nn.Module):
    """The single-process reference: all E experts here. forward: (N, H) → (N, H), or (y, aux loss) with
    return_aux=True. capacity_factor None: dropless. The last forward's Routing is `self.last`."""

    def __init__(self, n_embd: int, experts: int, k: int = 2, hidden: int | None = None, init_seed: int = 0,
                 capacity_factor: float | None = None, aux_weight: float = 0.01):
        super().__init__()
        if not 1 <= k <= experts:
            raise ValueError(f"top-k routing needs 1 ≤ k ≤ experts ({experts}), got k = {k}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 (Switch uses 1.0–1.25) or None, got {capacity_factor!r}")
        gen = torch.Generator().manual_seed(init_seed)           # same weights on every rank, global RNG untouched
        self.k = k
        self.capacity_factor = capacity_factor
        self.aux_weight = aux_weight
        self.router = nn.Linear(n_embd, experts, bias=False)
        hidden = hidden or 4 * n_embd                            # a transformer MLP per expert: H → 4H → H
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(n_embd, hidden), nn.GELU(), nn.Linear(hidden, n_embd))
                                     for _ in range(experts))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        self.last: Routing | None = None

    def forward(self, x: torch.Tensor, return_aux: bool = False):
        routing = self.last = route(self.router, x, self.k, self.capacity_factor, self.aux_weight)
        kept, rows, expert_of_row = _kept_rows(x, routing)
        y = combine(routing.weights, _scatter_back(x.shape[0] * self.k, kept,
                                                   run_experts(self.experts, rows, expert_of_row)))
        return (y, routing.aux_loss) if return_aux else y


class _AllToAll(torch.autograd.Function):
    """Rows to other ranks: forward sends in_splits[j] rows to rank j and receives out_splits[j] from it;
    backward sends the gradients back the way they came (the transpose of an all-to-all is an all-to-all).
    `anchor`, a leaf that requires grad whenever grad is on, makes every rank's output need a gradient, so
    every rank runs the backward all-to-all, also one that received no rows or whose input needs none."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, anchor):  # (sum(in_splits), H)
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))       # (sum(out_splits), H)
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None, None


class ExpertParallelMoE(nn.Module):
    """Rank r's part of `reference`: the whole router and experts [r·E/n, (r+1)·E/n), copied, with the same
    k, capacity factor and aux weight. forward: this rank's tokens (N, H) → (N, H) (or (y, aux) with
    return_aux=True), equal to `reference` on the same tokens, dropped ones included."""

    def __init__(self, reference: MoE, group=None):
        super().__init__()
        self.group, self.k = group, reference.k
        self.capacity_factor, self.aux_weight = reference.capacity_factor, reference.aux_weight
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        total = len(reference.experts)
        if total % self.size:
            raise ValueError(f"{total} experts do not split over {self.size} ranks: use a number of experts "
                             f"that is a multiple of {self.size}")
        self.per_rank = total // self.size
        first = self.rank * self.per_rank
        # copies, so that the reference keeps its own weights and gradients to compare with
        self.router = copy.deepcopy(reference.router)                                   # (E, H), replicated
        self.experts = nn.ModuleList(copy.deepcopy(e) for e in reference.experts[first:first + self.per_rank])
        self.last: Routing | None = None                          # this rank's routing, last forward
        self.last_sent: list[int] = []                            # rows sent to each rank, last forward
        self.last_received: list[int] = []                        # rows received from each rank
        self.last_expert_rows: list[int] = []                     # rows each local expert processed

    def forward(self, x: torch.Tensor, return_aux: bool = False):    # (N, H)
        routing = self.last = route(self.router, x, self.k, self.capacity_factor, self.aux_weight)
        kept, rows, flat = _kept_rows(x, routing)                # (R,), (R, H), (R,) global expert ids
        order = torch.argsort(flat, stable=True)                 # rows grouped by expert, hence by rank
        per_expert = torch.bincount(flat, minlength=self.size * self.per_rank)  # (E,) kept rows to each expert
        # 1. counts: rank j receives, from every rank, how many rows go to each of j's experts
        incoming = torch.empty_like(per_expert)                   # (n·E/n,) source-major
        dist.all_to_all_single(incoming, per_expert, group=self.group)
        incoming = incoming.view(self.size, self.per_rank)       # (n, E/n)
        send = per_expert.view(self.size, self.per_rank).sum(1).tolist()  # rows to each rank
        recv = incoming.sum(1).tolist()                                    # rows from each rank
        self.last_sent, self.last_received = send, recv
        self.last_expert_rows = incoming.sum(0).tolist()
        # 2. dispatch; received rows are source-major, and within a source sorted by (local) expert
        anchor = torch.empty(0, requires_grad=torch.is_grad_enabled())
        got = _AllToAll.apply(rows[order], recv, send, self.group, anchor)   # (R_in, H)
        local_expert = (torch.arange(self.per_rank, device=x.device).repeat(self.size)
                        .repeat_interleave(incoming.reshape(-1)))
        done = run_experts(self.experts, got, local_expert)      # (R_in, H)
        # 3. combine: outputs go back to their tokens' ranks, then into token-major order, zeros where dropped
        back = _AllToAll.apply(done, send, recv, self.group, anchor)    # (R, H) in `order`
        y = combine(routing.weights, _scatter_back(x.shape[0] * self.k, kept, back[torch.argsort(order)]))
        return (y, routing.aux_loss) if return_aux else y


def expert_parallel_groups(ep: int) -> tuple[object, object]:
    """(this rank's expert-parallel group, its experts' data-parallel group) for the world split as
    theory.moe.ep_dp_groups(world, ep). Collective: every rank creates every group, in the same order."""
    ep_groups, dp_groups = ep_dp_groups(dist.get_world_size(), ep)
    mine = {}
    for kind, groups in (("ep", ep_groups), ("dp", dp_groups)):
        for members in groups:
            group = dist.new_group(members)
            if dist.get_rank() in members:
                mine[kind] = group
    return mine["ep"], mine["dp"]


def average_gradients(layer: ExpertParallelMoE, dp_group, world_group=None) -> None:
    """Gradients of the mean of every rank's loss: an expert's gradient already sums its expert-parallel
    group's tokens (the all-to-all brought them), so it is summed over `dp_group`; the router's over all
    ranks (`world_group`); both ÷ world size. One all-reduce each (buckets.allreduce_mean)."""
    world = dist.get_world_size(world_group)
    for index, (module, group) in enumerate(((layer.experts, dp_group), (layer.router, world_group))):
        trained = [p for p in module.parameters() if p.requires_grad]     # frozen ones keep grad None
        if trained:
            allreduce_mean(Bucket(index, trained), group, world)
