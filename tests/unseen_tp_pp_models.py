"""Models tensor and pipeline parallelism have never seen (tests/test_tp_pp_generic.py): a plain MLP, a small
language model with its own attention (names unlike TinyGPT's) and its plan, and a stack of layers whose outputs
all differ in shape. Every builder seeds the global RNG, so every rank builds the same weights."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def plain_mlp(seed: int = 0) -> nn.Sequential:
    """The smallest tensor-parallel unit: Linear(16, 32) colwise, GELU, Linear(32, 16) rowwise."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


class SelfAttention(nn.Module):
    """Multi-head attention under its own names; like TinyGPT's it counts its heads from a weight, so a colwise
    shard holding heads/t of them runs the same code."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.head_dim = dim // heads
        self.query, self.key, self.value = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, x):                          # (B, T, D)
        B, T, _ = x.shape
        heads = self.query.weight.shape[0] // self.head_dim

        def split(t):                              # (B, T, heads·hd) → (B, heads, T, hd)
            return t.view(B, T, heads, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)))
        return self.out(y.transpose(1, 2).reshape(B, T, heads * self.head_dim))


class AttentionBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim), SelfAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 3 * dim), nn.ReLU(), nn.Linear(3 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.ff(self.norm2(x))


class AttentionLM(nn.Module):
    """Tokens (B, T) → logits (B, T, vocab): an embedding, learned positions, two attention + MLP blocks, an
    untied head. Bidirectional attention, 3x MLP, names unlike TinyGPT's."""
    VOCAB, DIM, HEADS, SEQ = 24, 32, 4, 8

    def __init__(self, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.tok, self.pos = nn.Embedding(self.VOCAB, self.DIM), nn.Embedding(self.SEQ, self.DIM)
        self.layers = nn.ModuleList(AttentionBlock(self.DIM, self.HEADS) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(self.DIM), nn.Linear(self.DIM, self.VOCAB, bias=False)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1)))
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


LM_PLAN = {"tok": "vocab", "layers.*.attn.query": "colwise", "layers.*.attn.key": "colwise",
           "layers.*.attn.value": "colwise", "layers.*.attn.out": "rowwise",
           "layers.*.ff.0": "colwise", "layers.*.ff.2": "rowwise", "head": "colwise"}
LM_INPUTS = ("layers.*.attn",)                     # one f for query, key and value; ff.0 and head get their own


def widths_stack(seed: int = 0) -> nn.Sequential:
    """Six layers whose outputs all differ: (b, 24), (b, 12), (b, 2, 8), (b, 20), (b, 6), (b, 4)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Sequential(nn.Linear(8, 24), nn.Tanh()), nn.Linear(24, 12),
                         nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Unflatten(1, (2, 8))),
                         nn.Sequential(nn.Flatten(), nn.Linear(16, 20), nn.Tanh()), nn.Linear(20, 6), nn.Linear(6, 4))
