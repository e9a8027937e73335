"""Expert parallelism (专家并行, EP): a mixture-of-experts layer whose experts live on different ranks.

    (a layer, not a `train` strategy: notebook 07 and tests/test_moe.py run it under torchrun)

**The layer** (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021).
E expert MLPs replace one MLP; a router (a replicated H → E linear) sends each token to its top-k experts
(k = 1: Switch; k = 2: GShard) and the layer's output is the gate-weighted sum of those experts' outputs:

    g = softmax(x · W_r)                      (N, E) gate probabilities
    y = Σ_{e ∈ topk(g)} ĝ_e · expert_e(x)     ĝ: top-k gates, renormalised to sum to 1 when k > 1

Parameters grow E-fold, compute per token stays k experts: that is why the source notes put MoE (>30B) next
to 3D parallelism. This layer is *dropless* (no capacity factor: no token is dropped), so it equals the
single-process `MoE` exactly.

**Sharded**: experts. With n ranks, rank r holds experts [r·E/n, (r+1)·E/n) and its own tokens (the tokens
of its data-parallel slice); the router is replicated (its gradient is summed over ranks like DP's).

**Communicated** — two all-to-alls per forward, two in backward (GShard §3.2):
1. counts: each rank tells each other how many of its tokens go to each of that rank's experts (E ints);
2. dispatch: each token row (H floats, once per chosen expert) goes to its expert's rank;
3. combine: each expert output comes back to the token's rank (the same sizes, reversed).
Backward runs combine's and dispatch's transposes: the same bytes again. Per rank, per all-to-all,

    bytes sent = (N·k − rows kept on this rank) · H · 4     ≈ (n−1)/n · N·k·H·4 under balanced routing

so a forward (dispatch + combine) sends ≈ 2(n−1)/n · N·k·H·4, and its backward as much again.

which `CommTracer` measures (it counts the rows `all_to_all_single` sends to other ranks).
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F



def route(router: nn.Linear, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H) tokens → gate weights (N, k) and expert ids (N, k) of each token's top-k experts."""
    gates = F.softmax(router(x), dim=-1)                        # (N, E)
    weights, experts = gates.topk(k, dim=-1)                    # (N, k), (N, k)
    if k > 1:
        weights = weights / weights.sum(dim=-1, keepdim=True)   # GShard: the k gates sum to 1
    return weights, experts


def run_experts(experts: nn.ModuleList, rows: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """(R, H) rows, (R,) local expert id per row → (R, H): each row through its own expert."""
    out = torch.zeros_like(rows)
    for e, expert in enumerate(experts):
        idx = (expert_of_row == e).nonzero().squeeze(1)         # (R_e,) rows for expert e
        if idx.numel():
            out = out.index_copy(0, idx, expert(rows[idx]))      # out of place: autograd sees each expert
    return out


def combine(weights: torch.Tensor, expert_out: torch.Tensor) -> torch.Tensor:
    """(N, k) gates and (N·k, H) expert outputs, token-major → (N, H) gate-weighted sum."""
    n, k = weights.shape
    return (weights.unsqueeze(-1) * expert_out.view(n, k, -1)).sum(dim=1)


class MoE(nn.Module):
    """The single-process reference: all E experts here. forward: (N, H) → (N, H)."""

    def __init__(self, n_embd: int, experts: int, k: int = 2, hidden: int | None = None, init_seed: int = 0):
        super().__init__()
        if not 1 <= k <= experts:
            raise ValueError(f"top-k routing needs 1 ≤ k ≤ experts ({experts}), got k = {k}")
        gen = torch.Generator().manual_seed(init_seed)           # same weights on every rank, global RNG untouched
        self.k = k
        self.router = nn.Linear(n_embd, experts, bias=False)
        hidden = hidden or 4 * n_embd                            # a transformer MLP per expert: H → 4H → H
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(n_embd, hidden), nn.GELU(), nn.Linear(hidden, n_embd))
                                     for _ in range(experts))
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = route(self.router, x, self.k)        # (N, k), (N, k)
        rows = x.repeat_interleave(self.k, dim=0)                # (N·k, H): token i's k copies, token-major
        return combine(weights, run_experts(self.experts, rows, experts.reshape(-1)))


class _AllToAll(torch.autograd.Function):
    """Rows to other ranks: forward sends in_splits[j] rows to rank j and receives out_splits[j] from it;
    backward sends the gradients back the way they came (the transpose of an all-to-all is an all-to-all)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):          # (sum(in_splits), H)
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))       # (sum(out_splits), H)
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class ExpertParallelMoE(nn.Module):
    """Rank r's part of `reference`: the whole router and experts [r·E/n, (r+1)·E/n), copied.
    forward: this rank's tokens (N, H) → (N, H), equal to `reference` on the same tokens."""

    def __init__(self, reference: MoE, group=None):
        super().__init__()
        self.group, self.k = group, reference.k
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
        self.last_sent: list[int] = []                           # rows sent to each rank, last forward
        self.last_received: list[int] = []                       # rows received from each rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:         # (N, H)
        weights, experts = route(self.router, x, self.k)        # (N, k), (N, k) global expert ids
        flat = experts.reshape(-1)                               # (N·k,) token-major
        order = torch.argsort(flat, stable=True)                 # rows grouped by expert, hence by rank
        rows = x.repeat_interleave(self.k, dim=0)[order]         # (N·k, H) sorted by destination
        per_expert = torch.bincount(flat, minlength=self.size * self.per_rank)  # (E,) rows to each expert
        # 1. counts: rank j receives, from every rank, how many rows go to each of j's experts
        incoming = torch.empty_like(per_expert)                   # (n·E/n,) source-major
        dist.all_to_all_single(incoming, per_expert, group=self.group)
        incoming = incoming.view(self.size, self.per_rank)       # (n, E/n)
        send = per_expert.view(self.size, self.per_rank).sum(1).tolist()  # rows to each rank
        recv = incoming.sum(1).tolist()                                    # rows from each rank
        self.last_sent, self.last_received = send, recv          # for the traffic and load-balance checks
        # 2. dispatch; received rows are source-major, and within a source sorted by (local) expert
        got = _AllToAll.apply(rows, recv, send, self.group)     # (R, H)
        local_expert = torch.arange(self.per_rank, device=x.device).repeat(self.size).repeat_interleave(incoming.reshape(-1))
        done = run_experts(self.experts, got, local_expert)      # (R, H)
        # 3. combine: outputs go back to their tokens' ranks, then back into token-major order
        back = _AllToAll.apply(done, send, recv, self.group)    # (N·k, H) in `order`
        expert_out = back[torch.argsort(order)]                  # (N·k, H) token-major again
        return combine(weights, expert_out)


def dispatch_bytes(rows_sent: list[int], rank: int, hidden: int, element_size: int = 4) -> int:
    """Bytes `rank` sends in one dispatch (or combine): the rows whose expert lives on another rank."""
    return (sum(rows_sent) - rows_sent[rank]) * hidden * element_size
