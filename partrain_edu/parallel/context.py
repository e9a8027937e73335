"""Context parallelism (上下文并行): ring attention over the sequence, balanced for causal masks by zig-zag shards.

    partrain-edu train --strategy cp --nproc 4 --cp 4 --json

**Sharded**: the sequence. Each of the n ranks holds T/n positions of every activation (`Sharding`; zig-zag: rank r
holds chunks r and 2n−1−r of 2n, so under a causal mask every rank has the same work: Llama 3's layout, Dubey et
al. 2024, §3.3.2; Striped Attention, Brandon et al. 2023, stripes instead). Everything but attention is token by token.
**Sent**: attention needs every key. The K and V blocks travel around the ring, one hop per step, and each rank
merges the blocks' partial softmaxes with their log-sum-exp (Liu et al. 2023, "Ring Attention with Blockwise
Transformers for Near-Infinite Context"; the online softmax of FlashAttention). Backward sends K, V around again
and the dK, dV accumulators with them, home after n−1 hops:

    bytes sent per rank = (n−1)/n · (bytes of the whole K and V)   forward;   twice that backward

This pass-KV ring is one of two ways. Llama 3 (Dubey et al. 2024, §3.3.2) and PyTorch's `context_parallel` (its
default rotate method is "allgather"; `set_rotate_method("alltoall")` gives the ring) all-gather K and V instead:
the same forward bytes in one exposed collective, cheap when GQA makes K and V small.
Only a rank's own q, k, v, its output and log-sum-exp are saved: activation memory per rank falls as 1/n.
`RingAttention(group, sharding).apply(model)` runs every `F.scaled_dot_product_attention` inside the model's forward
this way, as PyTorch's `context_parallel` does (which has no rule for the CPU attention kernel).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.parallel.ring import ring_neighbours

KV_TAG, GRAD_TAG = 1, 2   # K, V and their gradients cross the same links: separate tags keep them apart


@dataclass(frozen=True)
class Sharding:
    """Which positions of a sequence of `seq_len` each of `n` ranks holds: contiguous blocks, or zig-zag chunks."""

    seq_len: int
    n: int
    zigzag: bool = True

    def __post_init__(self):
        parts = 2 * self.n if self.zigzag else self.n
        if self.seq_len % parts:
            how = f"2 × {self.n} zig-zag chunks" if self.zigzag else f"{self.n} ranks"
            raise ValueError(f"sequence length {self.seq_len} is not divisible by {parts} ({how}): "
                             f"pick a length that is a multiple of {parts}")

    def segments(self, rank: int) -> list[tuple[int, int]]:
        """The (start, end) runs of positions `rank` holds, in its local order."""
        if not self.zigzag:
            size = self.seq_len // self.n
            return [(rank * size, (rank + 1) * size)]
        c = self.seq_len // (2 * self.n)
        return [(rank * c, (rank + 1) * c), ((2 * self.n - 1 - rank) * c, (2 * self.n - rank) * c)]

    def positions(self, rank: int) -> torch.Tensor:
        return torch.cat([torch.arange(a, b) for a, b in self.segments(rank)])

    def shard(self, x: torch.Tensor, rank: int, dim: int = 1) -> torch.Tensor:
        """This rank's positions of `x` along `dim` (a copy)."""
        return torch.cat([x.narrow(dim, a, b - a) for a, b in self.segments(rank)], dim)

    def unshard(self, shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
        """Every rank's shard (in rank order) put back into sequence order."""
        order = torch.cat([self.positions(r) for r in range(self.n)]).argsort()
        return torch.cat(shards, dim).index_select(dim, order)


def _pairs(q_segs, k_segs, causal: bool, device):
    """(local q slice, local k slice, mask) for every pair of position runs with a visible key: mask None when
    every key is visible, else the boolean q ≥ k; pairs whose keys all lie after all queries are skipped (the
    work a causal mask saves)."""
    def local(segs):
        out, start = [], 0
        for a, b in segs:
            out.append((slice(start, start + b - a), a, b))
            start += b - a
        return out
    for qs, qa, qb in local(q_segs):
        for ks, ka, kb in local(k_segs):
            if not causal or qa >= kb - 1:
                yield qs, ks, None
            elif qb - 1 >= ka:
                yield qs, ks, (torch.arange(qa, qb, device=device)[:, None] >= torch.arange(ka, kb, device=device))


def _scores(q, k, mask, scale):
    s = q @ k.transpose(-1, -2) * scale
    return s if mask is None else s.masked_fill(~mask, float("-inf"))


def _no_inf(x: torch.Tensor) -> torch.Tensor:
    return x.masked_fill(x == float("-inf"), 0.0)   # a row that sees no key yet: exp(−inf − 0) = 0, never NaN


def _hops(kv: torch.Tensor, group):
    """The n steps around the ring, forward's and backward's alike: yields (step, src, kv, sent), the K, V block
    held at this step (rank src's) and the bytes it is sent on with. The next block arrives while the caller
    computes on this one (the ring's overlap); the exchange is waited for when the caller asks for the next."""
    me, n, right, left = ring_neighbours(group)
    for step in range(n):
        works, incoming = [], None
        if step < n - 1:                          # pass it on while computing on it
            incoming = torch.empty_like(kv)
            works = [dist.irecv(incoming, src=left, group=group, tag=KV_TAG),
                     dist.isend(kv, dst=right, group=group, tag=KV_TAG)]
        yield step, (me - step) % n, kv, (kv.numel() * kv.element_size() if works else 0)
        for w in works:
            w.wait()
        kv = incoming if incoming is not None else kv


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, sharding, causal, scale, log):
        me = dist.get_rank(group)
        qf = q.float()
        out = torch.zeros_like(qf)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        for step, src, kv, sent in _hops(torch.stack([k, v]), group):   # K and V: one message per hop
            scores = 0
            for qs, ks, mask in _pairs(sharding.segments(me), sharding.segments(src), causal, q.device):
                s = _scores(qf[..., qs, :], kv[0, ..., ks, :].float(), mask, scale)
                block_lse = torch.logsumexp(s, -1)
                block_out = torch.exp(s - _no_inf(block_lse)[..., None]) @ kv[1, ..., ks, :].float()
                new = torch.logaddexp(lse[..., qs], block_lse)   # merge: softmax over both key sets
                out[..., qs, :] = (out[..., qs, :] * torch.exp(lse[..., qs] - _no_inf(new))[..., None]
                                   + block_out * torch.exp(block_lse - _no_inf(new))[..., None])
                lse[..., qs] = new
                scores += s.shape[-2] * s.shape[-1]
            if log is not None:
                log.append({"pass": "forward", "step": step, "block": src, "scores": scores, "sent": sent})
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)  # this rank's blocks only: 1/n of the whole sequence's
        ctx.group = group
        ctx.sharding = sharding
        ctx.causal = causal
        ctx.scale = scale
        ctx.log = log
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        sharding = ctx.sharding
        scale = ctx.scale
        log = ctx.log
        me, n, right, left = ring_neighbours(group)
        qf, do = q.float(), dout.float()
        delta = (do * out.float()).sum(-1)          # D_i = Σ_d dO·O: softmax's backward, per query (FlashAttention-2)
        dq = torch.zeros_like(qf)
        own, sending = None, []
        for step, src, kv, sent in _hops(torch.stack([k, v]), group):   # K, V around again, as forward
            dkv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
            for qs, ks, mask in _pairs(sharding.segments(me), sharding.segments(src), ctx.causal, q.device):
                kb, vb = kv[0, ..., ks, :].float(), kv[1, ..., ks, :].float()
                p = torch.exp(_scores(qf[..., qs, :], kb, mask, scale) - _no_inf(lse[..., qs])[..., None])
                dkv[1, ..., ks, :] += p.transpose(-1, -2) @ do[..., qs, :]
                ds = p * (do[..., qs, :] @ vb.transpose(-1, -2) - delta[..., qs, None])
                dq[..., qs, :] += ds @ kb * scale
                dkv[0, ..., ks, :] += ds.transpose(-1, -2) @ qf[..., qs, :] * scale
            if step == 0:
                own = dkv                           # this rank's own block: its gradient stays here
            else:                                   # the accumulator of block src rides the ring towards src
                if step >= 2:
                    acc = torch.empty_like(dkv)
                    dist.recv(acc, src=left, group=group, tag=GRAD_TAG)
                    dkv += acc
                # fp32 accumulators: the formula's bytes for fp32 inputs, twice K, V's for 16-bit ones
                sending.append((dkv, dist.isend(dkv, dst=right, group=group, tag=GRAD_TAG)))
                sent += dkv.numel() * dkv.element_size()
            if log is not None:
                log.append({"pass": "backward", "step": step, "block": src, "sent": sent})
        if n > 1:                                   # the last hop brings my block's sum home
            home = torch.empty_like(own)
            dist.recv(home, src=left, group=group, tag=GRAD_TAG)
            own += home
        for _, w in sending:
            w.wait()
        return dq.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype), None, None, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None, *, sharding: Sharding,
                   causal: bool = False, scale: float | None = None, log: list | None = None) -> torch.Tensor:
    """softmax(q·kᵀ·scale [causal]) · v over the whole sequence, for this rank's queries: q, k, v are this rank's
    (B, heads, T/n, hd) blocks, laid out by `sharding` over `group`. Every rank of `group` must call it.
    `log` gets one row per ring step: the block held, score entries computed, bytes sent."""
    if not (q.shape == k.shape == v.shape) or q.dim() != 4:
        raise ValueError(f"ring attention needs q, k, v of one shape (B, heads, T/n, hd), got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}: repeat grouped K/V heads before the call")
    n = dist.get_world_size(group)
    if sharding.n != n or q.shape[-2] != sharding.seq_len // n:
        raise ValueError(f"this rank holds {q.shape[-2]} positions of a group of {n}, but the sharding is "
                         f"{sharding.seq_len} positions over {sharding.n}: shard with Sharding(seq_len, n={n})")
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _RingAttention.apply(q, k, v, group, sharding, causal, scale, log)


class ShardedPositions(nn.Embedding):
    """A learned position embedding looked up at this rank's positions: the model asks for 0..T/n−1 (it sees
    T/n tokens), the rank holds `positions` (e.g. `RingAttention.positions()`). Same weight, same name."""

    def __init__(self, full: nn.Embedding, positions: torch.Tensor):
        super().__init__(full.num_embeddings, full.embedding_dim, device="meta")
        self.weight = full.weight
        # a plain attribute, not a buffer: DDP broadcasts buffers from rank 0, and each rank's positions differ
        self.positions = positions.to(full.weight.device)

    def forward(self, local: torch.Tensor) -> torch.Tensor:
        return super().forward(self.positions[local])


class RingAttention:
    """Context parallelism for any module: `apply(module)` makes every `F.scaled_dot_product_attention` inside
    its forward a ring attention over `group` (like PyTorch's `context_parallel`, which patches SDPA too).
    The model is otherwise untouched (same parameters, names, state_dict); feed it `shard(x)`, and give it this
    rank's `positions()` wherever it looks positions up. `log` collects every call's ring steps."""

    def __init__(self, group, sharding: Sharding):
        self.group = group
        self.sharding = sharding
        self.log = []
        self.rank = dist.get_rank(group)
        self._saved = None

    def positions(self) -> torch.Tensor:
        return self.sharding.positions(self.rank)

    def shard(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return self.sharding.shard(x, self.rank, dim)

    def sdpa(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is not None or dropout_p or enable_gqa:
            raise ValueError("ring attention supports is_causal and scale only (no attn_mask, dropout_p, "
                             "enable_gqa): masks are built from each block's positions; repeat K/V heads yourself")
        return ring_attention(q, k, v, self.group, sharding=self.sharding, causal=is_causal, scale=scale,
                              log=self.log)

    def __enter__(self):
        if self._saved is None:      # entered once, however deeply nested: exit restores torch's own
            self._saved, F.scaled_dot_product_attention = F.scaled_dot_product_attention, self.sdpa
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            F.scaled_dot_product_attention, self._saved = self._saved, None
        return False

    def apply(self, module: nn.Module) -> nn.Module:
        """Hook `module`'s forward (in place; the hooks also restore SDPA when the forward raises)."""
        def enter(*_):
            self.__enter__()

        def leave(*_):
            self.__exit__()
        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave, always_call=True)
        return module

    def sent(self, pass_: str) -> int:
        """Bytes this rank sent around the ring in every `pass_` ("forward" or "backward") logged so far."""
        return sum(row["sent"] for row in self.log if row["pass"] == pass_)
