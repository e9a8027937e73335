"""The trusted model of exercise 12's check (ring_attention.py): the configurations a run draws, full softmax
attention over the whole sequence in float64 with its gradients, and the ring's likely mistakes, simulated, so that
a wrong output can be recognised as one of them. Registers no check.

A configuration is a group of ranks (the default group of 4, or the group of global ranks [1, 2, 3]), causal or
not, the heads, the positions per rank R, the head dim, and a seed for q, k, v and the loss weights w.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from partrain_edu.grading.trials import stream

WORLD, SUBGROUP = 4, (1, 2, 3)


@dataclass(frozen=True)
class Config:
    members: tuple[int, ...]   # the group's global ranks (all of them: the default group, passed as group=None)
    causal: bool
    heads: int
    rows: int                  # positions per rank, R
    dim: int
    data: int                  # seeds q, k, v and the loss weights

    @property
    def label(self) -> str:
        group = f"group {list(self.members)}" if len(self.members) < WORLD else f"default group of {WORLD}"
        return (f"{group}, {'causal' if self.causal else 'non-causal'} ({self.heads} head(s), {self.rows} "
                f"positions per rank, head dim {self.dim})")

    def block(self, g: int) -> slice:
        return slice(g * self.rows, (g + 1) * self.rows)


def configs(seed: int) -> list[Config]:
    """The run's configurations: the default group, then [1, 2, 3]; each non-causal, then causal."""
    rng = stream(seed, "ring_attention")
    return [Config(members, causal, rng.randint(1, 3), rng.randint(2, 5), rng.randint(2, 8), rng.randrange(2**31))
            for members in (tuple(range(WORLD)), SUBGROUP) for causal in (False, True)]


def tensors(cfg: Config) -> tuple[torch.Tensor, ...]:
    """Q, K, V and the loss weights w of the whole sequence, (heads, n·R, head dim), float32. Q is scaled up so
    each query's softmax mass is spread very unevenly over the blocks: averaging them instead shows."""
    gen = torch.Generator().manual_seed(cfg.data)
    shape = (cfg.heads, len(cfg.members) * cfg.rows, cfg.dim)
    q = 2 * torch.randn(shape, generator=gen)
    return (q, *(torch.randn(shape, generator=gen) for _ in range(3)))


def attention(q, k, v, causal: bool) -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v over the whole sequence; causal: key j hidden from query i when j > i."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        pos = torch.arange(q.shape[-2])
        scores = scores.masked_fill(pos[None, :] > pos[:, None], -math.inf)
    return scores.softmax(-1) @ v


@functools.lru_cache(maxsize=8)
def reference(cfg: Config) -> dict:
    """q, k, v, w in float64, the output, their gradients, and dK, dV of each member's own queries' share alone."""
    q, k, v, w = (t.double() for t in tensors(cfg))
    with torch.enable_grad():  # the learner's kernel may have turned autograd off
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = attention(*leaves, cfg.causal)
        grads = torch.autograd.grad((out * w).sum(), leaves, retain_graph=True)
        own = []
        for g in range(len(cfg.members)):  # what comes back without any pass: member g's own queries' share
            rows = cfg.block(g)
            dk, dv = torch.autograd.grad((out[:, rows] * w[:, rows]).sum(), leaves[1:], retain_graph=True)
            own.append((dk[:, rows], dv[:, rows]))
    return {"qkv": (q, k, v), "out": out.detach(), "grads": grads, "own": own}


def ring_output(cfg: Config, g: int, *, steps: int | None = None, me: int | None = None, n: int | None = None,
                owner=lambda me, s, n: (me - s) % n, merge: str = "log-sum-exp", causal: bool | None = None):
    """Member g's output from a ring of `steps` steps — the block in hand at step s is member (g − s) mod n's, as
    pass_to_next delivers it — masked as if this rank were member `me` of `n` holding owner(me, s, n)'s block;
    merged with log-sum-exp, "average" (each block's own softmax, averaged) or "no rescale"."""
    q, k, v = reference(cfg)["qkv"]
    size = len(cfg.members)
    rows = cfg.rows
    steps, me, n = steps or size, g if me is None else me, n or size  # simultaneous: each reads the name it sets
    causal = cfg.causal if causal is None else causal
    qg, queries = q[:, cfg.block(g)], me * rows + torch.arange(rows)
    m = torch.full((cfg.heads, rows, 1), -math.inf, dtype=q.dtype)
    mass = 0
    acc = 0
    outs = []
    for s in range(steps):
        held = cfg.block((g - s) % size)
        scores = qg @ k[:, held].transpose(-2, -1) / math.sqrt(cfg.dim)
        if causal:
            keys = owner(me, s, n) * rows + torch.arange(rows)
            scores = scores.masked_fill(keys[None, :] > queries[:, None], -math.inf)
            if merge == "average" and bool(torch.isinf(scores).all()):
                continue
        outs.append(scores.softmax(-1) @ v[:, held])
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        rescale = 1 if merge == "no rescale" else torch.exp(m - m_new)
        p = torch.exp(scores - m_new)
        mass, acc, m = mass * rescale + p.sum(-1, keepdim=True), acc * rescale + p @ v[:, held], m_new
    return torch.stack(outs).mean(0) if merge == "average" else acc / mass


def mistakes(cfg: Config, g: int, rank: int) -> list[tuple[str, dict]]:
    """The likely mistakes for member g (global `rank`) of configuration `cfg`: what each says, how to make it."""
    found = [("your blocks were averaged, not weighted by their softmax mass — merge with log-sum-exp: keep a "
              "running max m and sum l per query, rescale the old l and output by exp(m_old − m_new), divide by l "
              "at the end", {"merge": "average"}),
             ("when a block raises the running max, the sum l and output so far must be multiplied by "
              "exp(m_old − m_new) — you kept adding terms measured against different maxima", {"merge": "no rescale"}),
             ("that is attention over your own block only — pass K and V around the ring, n−1 times", {"steps": 1})]
    if len(cfg.members) < WORLD:
        size = len(cfg.members)
        found += [(f"that is what a ring of the world's {WORLD} ranks computes on global rank {rank}: take the rank "
                   f"and the size from `group` (dist.get_rank(group) = {g}, dist.get_world_size(group) = {size})",
                   {"me": rank, "n": WORLD, "steps": WORLD}),
                  (f"that is what rank {rank} computes as member {rank} of the ring: its position in `group` is "
                   f"dist.get_rank(group) = {g}", {"me": rank}),
                  (f"that is a ring of {WORLD} steps: the ring has dist.get_world_size(group) = {size} members",
                   {"n": WORLD, "steps": WORLD})]
    if cfg.causal:
        found += [("that is non-causal attention — with causal=True hide every key after its query",
                   {"causal": False}),
                  ("you masked every block as if it were your own (by positions within the block); mask by global "
                   "position: the block you hold at step s came from rank (r − s) mod n",
                   {"owner": lambda me, s, n: me}),
                  ("your mask took the block in hand at step s for rank (r + s) mod n's; pass_to_next sends to r + 1, "
                   "so it came from rank (r − s) mod n", {"owner": lambda me, s, n: (me + s) % n}),
                  ("your mask took the block in hand at step s for rank s's; it came from rank (r − s) mod n",
                   {"owner": lambda me, s, n: s % n})]
    return found
