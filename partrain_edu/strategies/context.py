"""`cp`: TinyGPT with context parallelism — every rank holds T/cp positions of every sequence; attention is a ring.

    partrain-edu train --strategy cp --nproc 4 --cp 4 --steps 20 --json

Sharded: the sequence, zig-zag (`parallel.context.Sharding`: rank r holds chunks r and 2·cp−1−r of 2·cp, so the
causal mask leaves every rank the same work). Each rank runs the whole model on its positions: embeddings of its own
positions, token-by-token layers as they are, and attention through `parallel.context.RingAttention`, which turns
TinyGPT's `F.scaled_dot_product_attention` into ring attention over the cp group. Every parameter is replicated,
each rank's gradient is that of its own tokens' mean loss: DDP (`parallel.ddp`) over the cp group averages them
into the whole batch's gradient. Sent per layer and micro-batch — `theory.traffic`'s "cp":

    forward (cp−1)/cp · 2·b·s·h·e (K and V);  backward twice that (K, V again, and dK, dV)

plus the gradient all-reduce. The report's `comm` counts the ring as `isend` records; `report_facts()` reads the
same bytes from the ring's own log (Liu et al. 2023, "Ring Attention"; the zig-zag: Llama 3, Dubey et al. 2024).
"""
from __future__ import annotations

import dataclasses

from partrain_edu import topology
from partrain_edu.config import TrainConfig
from partrain_edu.parallel.context import RingAttention, ShardedPositions, Sharding
from partrain_edu.parallel.ddp import DistributedDataParallel
from partrain_edu.strategies.base import Strategy, register


@register("cp")
class ContextParallel(Strategy):
    """dp = tp = pp = 1: all ranks form one cp group, see the whole batch, each its own positions of it."""

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        cp = cfg.cp or cfg.nproc
        if cp != cfg.nproc or any((getattr(cfg, d) or 1) != 1 for d in ("dp", "tp", "pp")):
            raise ValueError(f"{cls.name} is context parallelism alone: give --cp equal to --nproc (got --cp {cp}, "
                             f"--nproc {cfg.nproc}) and no --dp/--tp/--pp")
        if cfg.model.seq_len % (2 * cp):
            fits = [c for c in range(1, cfg.model.seq_len // 2 + 1) if cfg.model.seq_len % (2 * c) == 0]
            raise ValueError(f"--cp {cp}: the zig-zag split needs 2 × cp chunks of the {cfg.model.seq_len} positions; "
                             f"use --cp {', '.join(map(str, fits))}")
        if cfg.global_batch % cfg.microbatches:
            raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by --microbatches "
                             f"{cfg.microbatches}")
        return 1, 1, 1

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.cp = cfg.cp or cfg.nproc
        built = topology.build({"dp": 1, "cp": self.cp, "tp": 1, "pp": 1}, ctx.device.type)
        self.ctx = dataclasses.replace(ctx, topology=built)
        self.ring = RingAttention(self.ctx.group("cp"), Sharding(cfg.model.seq_len, self.cp, zigzag=True))
        model = self.new_model()
        model.wpe = ShardedPositions(model.wpe, self.ring.positions())
        self.model = DistributedDataParallel(self.ring.apply(model), group=self.ctx.group("cp"))
        self.optimizer = self.new_optimizer(self.model.parameters())

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        self.ring.log.clear()                      # the log holds this step's ring steps only
        # Each rank's loss is the mean over its T/cp positions of every sequence; the loop's sum over ranks of
        # (loss × B, B) averages them: equal counts, so the batch's mean.
        loss_sum, count = self.accumulate(self.model, self.ring.shard(x), self.ring.shard(y),
                                          no_sync=self.model.no_sync)
        self.optimizer.step()
        return loss_sum, count

    def report_facts(self) -> dict:
        """The report's "context_parallel" entry: the layout, and the K/V bytes this rank sent around the ring in
        the last step, per pass, read from the ring's log (every rank sends the same)."""
        return {"context_parallel": {"cp": self.cp, "zigzag": self.ring.sharding.zigzag,
                                     "positions_per_rank": len(self.ring.positions()),
                                     "kv_bytes_sent_per_step": {p: self.ring.sent(p) for p in ("forward", "backward")}}}
