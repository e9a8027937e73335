"""TinyGPT — the one model every strategy trains — and a small MLP for first experiments.

GPT-2 style (Radford et al. 2019): token + learned position embeddings, `n_layer` pre-LayerNorm blocks of causal
self-attention and a 4x MLP, a final LayerNorm and an output head. Choices made for the course:
- the output head is *untied* from the token embedding, so no weight is shared across pipeline stages;
- query, key and value are three separate projections, so tensor parallelism can split each by heads
  (Megatron-LM, Shoeybi et al. 2019, §3) without unpacking a fused matrix;
- no dropout, and `init_seed` fixes the initial weights independently of the global RNG: every strategy,
  on any number of ranks, starts from exactly the same parameters, so their loss curves can be compared.

Defaults train in seconds on a laptop CPU:  python -c "from partrain_edu.models import *; print(TinyGPT())"
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 128
    seq_len: int = 32  # the context length (block size)
    n_layer: int = 4
    n_embd: int = 64  # hidden size h
    n_head: int = 4

    def __post_init__(self):
        for name in ("vocab_size", "seq_len", "n_layer", "n_embd", "n_head"):
            if getattr(self, name) <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}; "
                             "pick a hidden size that is a multiple of the number of heads")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.q = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.k = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.v = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, H = x.shape
        # Heads are counted from the projection's width, not the config, so the same code runs on a
        # tensor-parallel shard that holds n_head/tp heads (a (B, T, H/tp) projection).
        head_dim = H // self.n_head
        heads = self.q.out_features // head_dim

        def split(t: torch.Tensor) -> torch.Tensor:  # (B, T, heads*hd) -> (B, heads, T, hd)
            return t.view(B, T, heads, head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=True)
        y = y.transpose(1, 2).reshape(B, T, heads * head_dim)  # (B, T, heads*hd)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd: int, hidden: int | None = None):
        super().__init__()
        self.fc = nn.Linear(n_embd, hidden or 4 * n_embd)
        self.proj = nn.Linear(hidden or 4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd)
        self.mlp = MLP(cfg.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """`forward(idx) -> logits (B, T, vocab)`; `loss(logits, targets)` is the mean next-token cross-entropy."""

    def __init__(self, cfg: GPTConfig = GPTConfig(), init_seed: int = 0):
        super().__init__()
        self.cfg = cfg
        # nn.Linear draws a default init from the global RNG; fork it, so that building a model never
        # changes what the rest of the program draws (init_weights then sets every weight from init_seed).
        with torch.random.fork_rng(devices=[]):
            self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
            self.wpe = nn.Embedding(cfg.seq_len, cfg.n_embd)
            self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
            self.ln_f = nn.LayerNorm(cfg.n_embd)
            self.head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        init_weights(self, init_seed, n_layer=cfg.n_layer)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        B, T = idx.shape
        if T > self.cfg.seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than seq_len={self.cfg.seq_len}")
        pos = torch.arange(T, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)  # (B, T, H)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, vocab)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


class TinyMLP(nn.Module):
    """A stack of Linear+GELU layers on vectors: the smallest model worth parallelising."""

    def __init__(self, sizes: tuple[int, ...] = (32, 64, 64, 8), init_seed: int = 0):
        super().__init__()
        if len(sizes) < 2 or min(sizes) <= 0:
            raise ValueError(f"sizes must list at least two positive widths, got {sizes}")
        layers: list[nn.Module] = []
        with torch.random.fork_rng(devices=[]):  # as in TinyGPT: the global RNG stays untouched
            for i, (d_in, d_out) in enumerate(itertools.pairwise(sizes)):
                layers.append(nn.Linear(d_in, d_out))
                if i < len(sizes) - 2:
                    layers.append(nn.GELU())
        self.net = nn.Sequential(*layers)
        init_weights(self, init_seed, n_layer=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, n_layer: int) -> None:
    """GPT-2 initialisation from a private generator: N(0, 0.02), residual projections scaled by
    1/sqrt(2·n_layer) (Radford et al. 2019, §2.3), zero biases, unit LayerNorm. The global RNG is untouched."""
    gen = torch.Generator().manual_seed(seed)
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj") else 0.02
            module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
