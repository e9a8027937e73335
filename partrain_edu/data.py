"""Synthetic token data that a tiny GPT can learn, made in code (no download), and the data-parallel split.

The text is drawn from a fixed random Markov chain: each token has `successors` likely next tokens. A model
that learns the chain's table drives the loss from ln(vocab) ≈ 4.85 (guessing) towards the chain's entropy —
so a falling loss curve means real learning, and every run with the same seed sees the same tokens.

The data-parallel rule every strategy follows (the DDP equation of the source notes): the step's *global*
batch is fixed by (seed, step); data-parallel rank r of D takes rows [r·B/D, (r+1)·B/D), and each slice is
cut into micro-batches. The mean of the per-slice mean losses is then exactly the global-batch mean loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SyntheticTokens:
    vocab_size: int = 128
    seq_len: int = 32
    seed: int = 0
    successors: int = 4  # how many next tokens each token allows: fewer = easier to learn

    def __post_init__(self):
        if min(self.vocab_size, self.seq_len, self.successors) <= 0:
            raise ValueError("vocab_size, seq_len and successors must be positive")
        if self.successors > self.vocab_size:
            raise ValueError(f"successors={self.successors} cannot exceed vocab_size={self.vocab_size}")

    def transition_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(next_tokens (V, k), probabilities (V, k)): the chain the model has to discover."""
        gen = torch.Generator().manual_seed(self.seed)
        next_tokens = torch.stack([torch.randperm(self.vocab_size, generator=gen)[: self.successors]
                                   for _ in range(self.vocab_size)])
        weights = torch.rand(self.vocab_size, self.successors, generator=gen) + 0.1
        return next_tokens, weights / weights.sum(dim=1, keepdim=True)

    def entropy(self) -> float:
        """The best achievable loss (nats per token) for a model that knows the table."""
        _, probs = self.transition_table()
        return float(-(probs * probs.log()).sum(dim=1).mean())

    def global_batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and next-token targets, each (batch_size, seq_len), identical on every rank for a step."""
        if batch_size <= 0 or step < 0:
            raise ValueError(f"need batch_size > 0 and step >= 0, got {batch_size}, {step}")
        next_tokens, probs = self.transition_table()
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step + 1)
        tokens = torch.empty(batch_size, self.seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab_size, (batch_size,), generator=gen)
        for t in range(self.seq_len):
            choice = torch.multinomial(probs[tokens[:, t]], 1, generator=gen).squeeze(1)  # (B,)
            tokens[:, t + 1] = next_tokens[tokens[:, t], choice]
        return tokens[:, :-1], tokens[:, 1:]


def data_parallel_slice(x: torch.Tensor, y: torch.Tensor, dp_rank: int, dp_size: int):
    """Rank `dp_rank`'s contiguous share of the global batch."""
    batch = x.size(0)
    if dp_size <= 0 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} is not in 0..{dp_size - 1}")
    if batch % dp_size:
        raise ValueError(f"global batch {batch} is not divisible by {dp_size} data-parallel ranks; "
                         f"use a global batch that is a multiple of {dp_size}")
    share = batch // dp_size
    return x[dp_rank * share:(dp_rank + 1) * share], y[dp_rank * share:(dp_rank + 1) * share]


def split_microbatches(x: torch.Tensor, y: torch.Tensor, microbatches: int):
    """Cut a batch into `microbatches` equal micro-batches (gradient accumulation, pipeline filling)."""
    if microbatches <= 0 or x.size(0) % microbatches:
        raise ValueError(f"a batch of {x.size(0)} cannot be cut into {microbatches} equal micro-batches; "
                         "choose a micro-batch count that divides the per-rank batch")
    return list(zip(x.chunk(microbatches), y.chunk(microbatches), strict=True))


@dataclass(frozen=True)
class DataParallelSampler:
    """Gives data-parallel rank `dp_rank` of `dp_size` its slice of the same global batch, step by step."""

    data: SyntheticTokens
    global_batch: int
    dp_rank: int = 0
    dp_size: int = 1

    def __post_init__(self):
        if self.global_batch % self.dp_size:
            raise ValueError(f"global batch {self.global_batch} is not divisible by {self.dp_size} "
                             f"data-parallel ranks; use a multiple of {self.dp_size}")

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.data.global_batch(step, self.global_batch)
        return data_parallel_slice(x, y, self.dp_rank, self.dp_size)
