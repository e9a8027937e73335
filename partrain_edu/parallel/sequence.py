"""Sequence parallelism (序列并行): tensor parallelism's next step, splitting what it left whole along the sequence.

    partrain-edu train --strategy tp-sp --nproc 2 --tp 2 --steps 20 --json

**Sharded.** Tensor parallelism (tensor.py) splits the matmuls, but every rank still computes the LayerNorms,
the residual adds (and dropout) on the *whole* (B, T, H) activation and keeps it for backward: Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.2.2) count 10sbh of a layer's
34sbh + 5as²b bytes (16-bit) that tensor parallelism does not split. These ops work token by token, so rank r
can run them on its own T/t positions: between the split matmuls the activations are (B, T/t, H).

**Communicated** (tp_comm.py). Entering a tensor-parallel region all-gathers the sequence (forward) and
reduce-scatters the gradient (backward); leaving it reduce-scatters the partial sums instead of all-reducing
them. An all-gather plus a reduce-scatter send exactly the bytes of one all-reduce, 2(t−1)/t·S (ring): the same
traffic as tensor parallelism. Two extras: backward all-gathers each saved input shard again (below), and one
all-reduce per step sums the gradients of the whole-on-every-rank parameters (LayerNorms, row-parallel
biases, positions), each rank having seen only its positions.

**Activation memory per layer** (theory.memory, Korthikanti Table 2): sbh(10 + 24/t + 5as/(ht)) under tensor
parallelism becomes sbh(34/t + 5as/(ht)) — the 10sbh replicated part shrinks t-fold. Of those 10sbh, 4sbh are the
inputs of the QKV and first MLP matmuls (the rest: 4sbh LayerNorm inputs, 2sbh dropout masks; §4.2.2); to keep
only their (B, T/t, H) shard, the paper stores the shard and all-gathers it again in backward. We do that with
autograd's saved-tensor hooks (`pack`/`unpack` below), so the model code is unchanged;
`SequenceParallelRegion(group, regather=False)` keeps the whole input, to compare.
`SavedBytes` (saved_bytes.py) measures what a layer keeps; notebook 05 and the tests compare it with the formula.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn

from partrain_edu.parallel.saved_bytes import SavedBytes
from partrain_edu.parallel.tensor import TensorParallelRegion
from partrain_edu.parallel.tp_comm import (
    all_gather_sequence,
    all_reduce_,
    gather_from_sequence,
    reduce_scatter_to_sequence,
)


class _Regather:
    """A saved (B, T, H) activation kept as this rank's (B, T/t, H) shard, all-gathered again (once, however
    many matmuls saved it: q, k and v share one) when backward first needs it."""

    def __init__(self, shard: torch.Tensor, group):
        self.shard = shard
        self.group = group
        self._full = None

    def full(self) -> torch.Tensor:
        if self._full is None:
            self._full = all_gather_sequence(self.shard, self.group)  # (B, T, H)
        return self._full


class SequenceParallelRegion(TensorParallelRegion):
    """Korthikanti's g / ḡ instead of Megatron's f / g: the activations outside the split matmuls are sequence
    shards, (B, T/t, H)."""

    sequence_parallel = True

    def __init__(self, group, regather: bool = True):
        super().__init__(group)
        self.regather = regather
        self._gathered: list[tuple[weakref.ref, _Regather]] = []  # this forward's gathered inputs, while alive

    def enter(self, shard: torch.Tensor) -> torch.Tensor:  # (B, T/t, H) → (B, T, H)
        full = gather_from_sequence(shard, self.group)
        if self.regather:
            self._gathered = [(ref, token) for ref, token in self._gathered if ref() is not None]
            self._gathered.append((weakref.ref(full), _Regather(shard.detach(), self.group)))
        return full

    def exit(self, y: torch.Tensor) -> torch.Tensor:  # (B, T, H) partial sums → (B, T/t, H)
        return reduce_scatter_to_sequence(y, self.group)

    def positions(self, embedding: nn.Embedding) -> nn.Module:
        return SequenceShardedPositions(embedding, self)

    def pack(self, t: torch.Tensor):
        # A matmul saving (a view of) a gathered input keeps the shard instead: t/1 of the bytes. A live
        # tensor owns its storage, so a matching address cannot belong to anything else.
        for ref, token in self._gathered:
            full = ref()
            if full is not None and t.untyped_storage().data_ptr() == full.untyped_storage().data_ptr():
                return token, t.shape, t.stride(), t.storage_offset()
        return t

    def unpack(self, kept) -> torch.Tensor:
        if isinstance(kept, torch.Tensor):
            return kept
        token, shape, stride, offset = kept
        return token.full().as_strided(shape, stride, offset)  # the same view, of the re-gathered tensor

    def finish_grads(self, model: nn.Module) -> None:
        """Whole-on-every-rank parameters (LayerNorms, row-parallel biases, positions) saw only this rank's
        positions, so their gradients are partial sums: one all-reduce over one flat buffer completes them."""
        grads = [p.grad for p in model.parameters() if getattr(p, "tp_split_dim", None) is None and p.grad is not None]
        flat = all_reduce_(torch.cat([g.reshape(-1) for g in grads]), self.group)
        for g, summed in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(summed.view_as(g))


class SequenceShardedPositions(nn.Embedding):
    """The position embedding (whole on every rank) looked up for this rank's positions only: under sequence
    parallelism rank r holds tokens [r·T/t, (r+1)·T/t) of every sequence."""

    def __init__(self, full: nn.Embedding, region: SequenceParallelRegion):
        super().__init__(full.num_embeddings, full.embedding_dim, device="meta")
        self.region = region
        self.weight = full.weight  # the same parameter (same name), only the lookup changes

    def forward(self, pos: torch.Tensor) -> torch.Tensor:  # (T,) → (T/t, H)
        return super().forward(pos.chunk(self.region.size)[self.region.rank])


def layer_activation_bytes(block: nn.Module, x: torch.Tensor, region: TensorParallelRegion) -> SavedBytes:
    """What one transformer layer keeps for backward on this rank, given its input x: (B, T, H) under tensor
    parallelism, this rank's (B, T/t, H) under sequence parallelism. Runs the forward only (all ranks must call)."""
    meter = SavedBytes(block)
    x = x.detach().clone(memory_format=torch.contiguous_format).requires_grad_()  # its own storage, not a view's
    with region.saving(meter):
        out = block(x)
    del out  # the graph (and what it kept) goes with it
    return meter
