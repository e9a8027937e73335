"""`3d` and `3d-mesh`: data × pipeline × tensor parallelism on one world, the way Megatron-LM trains.

    partrain-edu train --strategy 3d --nproc 8 --dp 2 --tp 2 --pp 2 --microbatches 2 --json

Sharded: rank (s, d, t), r = (s·dp + d)·tp + t (`theory.grid`, groups from `ctx.with_layout`), holds pipeline
stage s's layers, of each layer the t-th tensor slice, and trains on the d-th slice of the batch: ≈ Ψ/(pp·tp).
Sent per step, each dimension in its own group (Narayanan et al. 2021, §3):
- tp: 4 all-reduces of (B/dp/m)·T·H per layer held and micro-batch, plus the embedding's and loss's;
- pp: each micro-batch's (B/dp/m, T, H) activation forward and its gradient back, per stage boundary;
- dp: one all-reduce of this rank's Ψ/(pp·tp) gradients after the pipeline has drained, 2(dp−1)/dp of them.
The pipeline sums (loss_mb / m)', TP's f/g make each slice's gradient the full model's slice, and the dp
average is the global batch's gradient: the losses equal `single`'s. `3d-mesh` takes the same groups from
`init_device_mesh(("pp", "dp", "tp"))`.
"""
from __future__ import annotations

from partrain_edu.config import TrainConfig
from partrain_edu.data import data_parallel_slice
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.buckets import plan_buckets
from partrain_edu.parallel.ddp import DEFAULT_BUCKET_CAP_BYTES
from partrain_edu.parallel.hybrid import dp_average_gradients
from partrain_edu.parallel.pipeline import PipelineExecutor
from partrain_edu.parallel.pp_comm import Boundary, Mailbox, agree_on_shapes
from partrain_edu.parallel.tensor import TensorParallelRegion, vocab_parallel_cross_entropy
from partrain_edu.strategies.base import Strategy, check_global_batch, in_flag_words, register
from partrain_edu.strategies.pipeline import split_tinygpt, tinygpt_stage
from partrain_edu.strategies.tensor import check_divisible, parallelize_tinygpt
from partrain_edu.theory.schedules import build_schedule


@register("3d")
class ThreeD(Strategy):
    """Stages of TP-split layers, replicated dp times; the 1F1B schedule inside each pipeline."""

    schedule_name = "1f1b"
    use_mesh = False

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        tp, pp = cfg.tp or 1, cfg.pp or 1
        dp = cfg.dp or cfg.nproc // (tp * pp) or 1
        if dp * tp * pp != cfg.nproc:
            raise ValueError(f"--dp {dp} × --tp {tp} × --pp {pp} = {dp * tp * pp} ranks, but there are "
                             f"{cfg.nproc}: pick sizes whose product is --nproc {cfg.nproc}")
        with in_flag_words():
            check_divisible(cfg.model, tp)
        if pp > cfg.model.n_layer:
            raise ValueError(f"--pp {pp} is more stages than the model's {cfg.model.n_layer} layers: use --pp "
                             f"{cfg.model.n_layer} or less")
        check_global_batch(cfg, dp)
        return dp, tp, pp

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.ctx = ctx = ctx.with_layout(dp=self.dp, tp=self.tp, pp=self.pp, use_mesh=self.use_mesh)
        d, s = ctx.coords["dp"], ctx.coords["pp"]
        full = self.new_model()                                 # the same init on every rank
        # 1. tensor parallel: keep every layer's t-th slice
        self.region = TensorParallelRegion(ctx.group("tp"))
        if self.tp > 1:
            full = parallelize_tinygpt(full, self.region)
        loss_fn = (lambda logits, y: vocab_parallel_cross_entropy(logits, y, self.region)) if self.tp > 1 \
            else TinyGPT.loss
        # 2. pipeline: keep stage s's layers, run by the 1F1B executor over the pp group
        lo, hi = split_tinygpt(full, self.pp)[s]
        self.stage = tinygpt_stage(full, lo, hi, first=s == 0, last=s == self.pp - 1).to(ctx.device)
        self.model = self.stage
        self.optimizer = self.new_optimizer(self.model.parameters())
        m = cfg.microbatches
        shape = (cfg.global_batch // (self.dp * m), cfg.model.seq_len, cfg.model.n_embd)  # (B/dp/m, T, H)
        agree_on_shapes({"shape": shape, "layers": [(lo, hi)]}, group=ctx.group("pp"))
        self.executor = PipelineExecutor(
            build_schedule(self.schedule_name, self.pp, m, 1), [self.stage], s, ctx.ranks("pp"),
            Mailbox([Boundary(shape)] * (self.pp - 1), m, device=ctx.device),  # global ranks: the world carries p2p
            loss_fn=loss_fn)
        # 3. data parallel: the stage's gradients in buckets, averaged over the dp group after each step
        self.buckets = plan_buckets([p for p in self.model.parameters() if p.requires_grad],
                                    DEFAULT_BUCKET_CAP_BYTES)
        self.dp_rank = d

    def train_step(self, x, y):
        x, y = data_parallel_slice(x, y, self.dp_rank, self.dp)   # (B/dp, T) this replica's batch
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, count = self.executor.step(x.to(self.ctx.device), y.to(self.ctx.device))
        self.region.finish_grads(self.model)
        if self.dp > 1:
            dp_average_gradients(self.buckets, self.ctx.group("dp"), self.dp)
        self.optimizer.step()
        # Every tp rank of the last stage holds the same loss: only t = 0 reports it, once per replica.
        return (loss_sum, count) if self.ctx.coords["tp"] == 0 else (0.0, 0)


@register("3d-mesh")
class ThreeDMesh(ThreeD):
    """The same, its groups from `init_device_mesh(("pp", "dp", "tp"))` instead of by hand."""
    use_mesh = True
