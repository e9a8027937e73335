"""The fixed inputs of the multi-rank checks, made from seeds so that the ranks (rank_observe.py) and the trusted
verifier (rank_verify.py) build exactly the same tensors, the verifier for every rank at once.

Models are built under `torch.random.fork_rng`: the verifier runs in the learner's kernel, whose own random
stream a check must not move.
"""
from __future__ import annotations

import torch
import torch.nn as nn

RING_LENGTHS = (12, 7, 2)          # divisible by 3 ranks, not divisible (uneven chunks), fewer elements than ranks
DDP_CAP_BYTES, DDP_BACKWARDS = 700, 2  # twice: the hooks must reset between backwards
ZERO1_NUMEL, ZERO1_STEPS, ZERO1_LR, ZERO1_BETA = 12, 3, 0.1, 0.9
FG_NAMES = ("f forward", "f backward", "g forward", "g backward")
MLP_HIDDEN = 8


RING_RANKS = 3
RING_TAG = 2 ** RING_RANKS  # > 2^0 + 2^1 + 2^2: the low bits of a sum say which ranks it holds


def ring_input(numel: int, rank: int) -> torch.Tensor:
    """Element i of rank r is 2^r + 8·i (notebook 01's 2^r trick): a sum over ranks S at position i is
    Σ_{r∈S} 2^r + |S|·8·i, so a wrong element tells which ranks it summed and which position it came from."""
    return 2.0 ** rank + RING_TAG * torch.arange(numel, dtype=torch.float32)


def decode_ring_sum(value: float, nproc: int, numel: int) -> tuple[set[int], int] | None:
    """(the ranks, the position) a sum of `nproc` ranks' ring_input(numel) elements `value` holds, or None when it
    is no such sum (tagged bits of a rank that does not exist, or a position past the end, are none)."""
    if value != int(value) or value <= 0:
        return None
    bits = int(value) % RING_TAG
    ranks = {r for r in range(RING_RANKS) if bits >> r & 1}
    rest = int(value) - bits
    if not ranks or max(ranks) >= nproc or rest % (RING_TAG * len(ranks)):
        return None
    position = rest // (RING_TAG * len(ranks))
    return (ranks, position) if position < numel else None


def toy_model() -> nn.Module:
    """The same weights on every rank, as DDP's initial broadcast would make them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def ddp_batch(backward: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10 * backward + rank)
    return torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)


def zero1_start() -> torch.Tensor:
    return torch.linspace(-1, 1, ZERO1_NUMEL)


def zero1_grad(step: int, rank: int) -> torch.Tensor:
    return torch.randn(ZERO1_NUMEL, generator=torch.Generator().manual_seed(7 * step + rank))


def fg_input(rank: int) -> torch.Tensor:
    return torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(rank))


def mlp_layers() -> tuple[nn.Linear, nn.Linear, torch.Tensor]:
    """The full MLP (fc: h → 4h, proj: 4h → h) and its input X, the same on every rank."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        h = MLP_HIDDEN
        fc, proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        return fc, proj, torch.randn(2, 3, h)


def mlp_columns(rank: int, world: int) -> slice:
    """Rank `rank`'s slice of the 4h hidden units: W1's rows, b1, W2's columns."""
    return slice(rank * 4 * MLP_HIDDEN // world, (rank + 1) * 4 * MLP_HIDDEN // world)


def loss_weights(y: torch.Tensor) -> torch.Tensor:
    """L = Σ Y·w with these fixed, distinct weights: every output element gets its own gradient."""
    return torch.arange(y.numel()).reshape(y.shape).sin()
