"""`tp` and `tp-sp`: TinyGPT split by Megatron's tensor parallelism, and its sequence-parallel variant.

    partrain-edu train --strategy tp --nproc 2 --tp 2 --steps 20 --json
    partrain-edu train --strategy tp-sp --nproc 2 --tp 2 --steps 20 --json

Sharded: each of the t ranks holds 1/t of every weight matrix: `parallel.tensor.parallelize` with TinyGPT's plan
below (q, k, v by heads: TinyGPT's attention counts its heads from q's width, so it runs on a shard as it is);
under `tp-sp` also the activations between the matmuls, by sequence (`parallel.sequence.SequenceParallelRegion`).
Sent per layer and micro-batch: 2 all-reduces forward, 2 backward, of b·s·h elements each (under `tp-sp` an
all-gather plus a reduce-scatter in place of each: the same bytes) — `theory.traffic`'s "tp":

    bytes sent per rank per layer = 4 · 2(t−1)/t · b·s·h·e

plus the embedding's g and the head's f (b·s·h each) and the loss's 3 all-reduces of b·s. dp = pp = 1: every rank
sees the whole batch; the loss is `parallel.tensor.vocab_parallel_cross_entropy`.
"""
from __future__ import annotations

import math

import torch.nn as nn

from partrain_edu.config import TrainConfig
from partrain_edu.data import split_microbatches
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.parallel.sequence import SequenceParallelRegion
from partrain_edu.parallel.tensor import TensorParallelRegion, parallelize, vocab_parallel_cross_entropy
from partrain_edu.strategies.base import Strategy, in_flag_words, register

# How TinyGPT's weights split: module-name pattern → style (torchtitan's declarative plan). torch_tp.py turns the
# same dict into DTensor's ColwiseParallel / RowwiseParallel, so the two versions split alike.
TP_PLAN = {
    "wte": "vocab",                                       # embedding rows: V/t tokens per rank
    "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",  # by heads
    "blocks.*.attn.proj": "rowwise",
    "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise",
    "head": "colwise",                                    # output columns: V/t logits per rank
}
# Modules whose input enters a split region: f runs once on it, shared by q, k and v (or fc, or the head).
REGION_INPUTS = ("blocks.*.attn", "blocks.*.mlp", "head")


def parallelize_tinygpt(model: TinyGPT, region: TensorParallelRegion) -> TinyGPT:
    """TinyGPT split in place by TP_PLAN; under sequence parallelism its positions are looked up per rank."""
    parallelize(model, TP_PLAN, region, inputs=REGION_INPUTS)
    model.wpe = region.positions(model.wpe)
    return model


def check_divisible(cfg: GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """One-line ValueError naming the fix unless every dimension tensor parallelism splits divides by tp, before
    any model is built (worded in sizes, `tp=3`: layouts re-word them as flags). The heads are checked here:
    `parallelize` sees only the weights, and a q shard must hold whole heads."""
    sizes = [("hidden size", cfg.n_embd), ("number of attention heads", cfg.n_head), ("vocabulary", cfg.vocab_size)]
    if sequence_parallel:
        sizes.append(("sequence length", cfg.seq_len))
    common = math.gcd(*(n for _, n in sizes))
    fits = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
    for what, n in sizes:  # the hidden size first: heads | hidden, so a tp that misses it misses the heads too
        if n % tp:
            raise ValueError(f"tp={tp} does not divide the {what} ({n}): every rank needs an equal slice; "
                             f"use tp={fits}")


@register("tp")
class TensorParallel(Strategy):
    """dp = 1: all ranks form one tensor-parallel group, see the whole batch and hold the same loss."""

    region_type = TensorParallelRegion

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        tp = cfg.tp or cfg.nproc
        if tp != cfg.nproc or (cfg.dp or 1) != 1 or (cfg.pp or 1) != 1:
            raise ValueError(f"{cls.name} is tensor parallelism alone: give --tp equal to --nproc (got --tp {tp}, "
                             f"--nproc {cfg.nproc}) and no --dp/--pp; the 3d strategy combines them")
        with in_flag_words():
            check_divisible(cfg.model, tp, cls.region_type.sequence_parallel)
        if cfg.global_batch % cfg.microbatches:
            raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by --microbatches "
                             f"{cfg.microbatches}")
        return 1, tp, 1

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.model = self.build_model()
        self.optimizer = self.new_optimizer(self.model.parameters())

    def build_model(self) -> nn.Module:
        self.ctx = self.ctx.with_layout(tp=self.tp)                 # dp = pp = 1: one tp group, every rank
        self.region = self.region_type(self.ctx.group("tp"))
        return parallelize_tinygpt(self.new_model(), self.region)

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        chunks = split_microbatches(x.to(self.ctx.device), y.to(self.ctx.device), self.cfg.microbatches)
        loss_sum = 0.0
        for xb, yb in chunks:  # (B/M, T) each; gradients summed with weight 1/M, as `Strategy.accumulate`
            with self.region.saving():
                loss = vocab_parallel_cross_entropy(self.model(xb), yb, self.region)
            (loss / len(chunks)).backward()
            loss_sum += loss.item() * xb.size(0)
        self.region.finish_grads(self.model)
        self.optimizer.step()
        # Every tensor-parallel rank computed the same loss on the same batch: only rank 0 reports it.
        return (loss_sum, x.size(0)) if self.region.rank == 0 else (0.0, 0)


@register("tp-sp")
class SequenceParallel(TensorParallel):
    """`tp` with sequence parallelism: same model, same loss, the sequence split between the matmuls."""

    region_type = SequenceParallelRegion
