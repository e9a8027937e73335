"""`fsdp-tp` and `torch-fsdp-tp`: 2D parallelism, FSDP over "dp" × Megatron's tensor parallelism over "tp".

    partrain-edu train --strategy fsdp-tp --nproc 4 --dp 2 --tp 2 --json
    partrain-edu train --strategy torch-fsdp-tp --nproc 4 --dp 2 --tp 2 --json

Sharded: rank (d, t) = d·tp + t (`theory.grid`, pp = 1) holds, of every weight matrix, the t-th tensor slice
(`parallel.tensor.parallelize`, strategies/tensor.py's plan) and of that slice's flat unit 1/dp
(`parallel.fsdp.FullyShardedDataParallel` over the dp group): ≈ Ψ/(dp·tp) of params, grads and AdamW states.
Sent per step, each dimension in its own group (PyTorch's 2D tutorial; Austin et al. 2025, "How to Scale Your
Model", §5 mixed FSDP + TP):
- tp: 4 all-reduces of (B/dp/m)·T·H per layer and micro-batch, plus the embedding's g, the head's f and the
  loss's 3 (b·T each) — `theory.traffic`'s "tp" with micro_batch = B/dp/m;
- dp: per unit and micro-batch, all-gather forward, all-gather backward, reduce-scatter of the tp slice's
  gradients — `theory.traffic`'s "zero3" with Ψ/tp parameters, 3·(dp−1)/dp·(Ψ/tp)·4 bytes.
`torch-fsdp-tp` does the same with DTensor: `parallelize_module` on mesh["tp"], then `fully_shard` on mesh["dp"]
of the one ("pp", "dp", "tp") device mesh (pp = 1: the 2 × 2 mesh of `init_device_mesh(("dp", "tp"))`).
"""
from __future__ import annotations

import contextlib
import warnings

from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import loss_parallel

from partrain_edu.comm.adapters import FunctionalCollectiveCounter
from partrain_edu.config import TrainConfig
from partrain_edu.data import data_parallel_slice, split_microbatches
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.fsdp import FullyShardedDataParallel
from partrain_edu.parallel.tensor import TensorParallelRegion, vocab_parallel_cross_entropy
from partrain_edu.strategies.base import Strategy, check_global_batch, in_flag_words, optimizer_state_tensors, register
from partrain_edu.strategies.tensor import check_divisible, parallelize_tinygpt
from partrain_edu.strategies.torch_tp import dtensor_parallelize_tinygpt
from partrain_edu.train_checks import fsdp_tp_degrees


@register("fsdp-tp")
class FsdpTp(Strategy):
    """TP-split TinyGPT inside, our FSDP (one unit per block, plus the root) around it over the dp group."""

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        dp, tp = fsdp_tp_degrees(cfg, cls.name)
        with in_flag_words():
            check_divisible(cfg.model, tp)
        check_global_batch(cfg, dp)
        return dp, tp, 1

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.ctx = self.ctx.with_layout(dp=self.dp, tp=self.tp, use_mesh=self.use_mesh())
        self.model = self.build_model()
        self.optimizer = self.new_optimizer(self.model.parameters())

    @staticmethod
    def use_mesh() -> bool:
        return False

    def build_model(self):
        # TP first: FSDP then shards each rank's tensor slice over its dp group (the order of the 2D tutorial).
        self.region = TensorParallelRegion(self.ctx.group("tp"))
        model = parallelize_tinygpt(self.new_model(), self.region)
        return FullyShardedDataParallel(model, self.ctx.group("dp"), units=list(model.blocks))

    def loss(self, xb, yb):
        return vocab_parallel_cross_entropy(self.model(xb), yb, self.region)

    def micro_batch(self):
        """What one micro-batch's forward and backward run under (nothing here)."""
        return contextlib.nullcontext()

    def train_step(self, x, y):
        x, y = data_parallel_slice(x, y, self.ctx.coords["dp"], self.dp)   # (B/dp, T): this dp replica's slice
        self.optimizer.zero_grad(set_to_none=True)
        chunks = split_microbatches(x.to(self.ctx.device), y.to(self.ctx.device), self.cfg.microbatches)
        loss_sum = 0.0
        for xb, yb in chunks:                           # FSDP reduce-scatters each micro-batch's gradients
            with self.micro_batch():
                loss = self.loss(xb, yb)
                (loss / len(chunks)).backward()
            loss_sum += loss.item() * xb.size(0)
        self.optimizer.step()
        # The tp ranks of one replica hold the same loss: only t = 0 reports it, once per dp slice.
        return (loss_sum, x.size(0)) if self.ctx.coords["tp"] == 0 else (0.0, 0)

    def state_tensors(self):
        pieces = list(self.model.parameters())
        return {"params": [flat.data for flat in self.model.flat_shards()],   # the chunks, padding included
                "grads": [p.grad for p in pieces if p.grad is not None],
                "optimizer": optimizer_state_tensors(self.optimizer)}


@register("torch-fsdp-tp")
class TorchFsdpTp(FsdpTp):
    """PyTorch's: `parallelize_module` (the course's DTensor plan) on mesh["tp"], `fully_shard` on mesh["dp"]."""

    count_collectives = True  # DTensor's all-reduces are functional collectives: counted for `comm`

    @staticmethod
    def use_mesh() -> bool:
        return True

    def build_model(self):
        # FSDP2 warnings that do not apply: the loop never edits the output in place, token ids need no grad.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")
        mesh = self.ctx.topology.mesh
        model = dtensor_parallelize_tinygpt(self.new_model(), mesh["tp"])
        for block in model.blocks:
            fully_shard(block, mesh=mesh["dp"])         # one unit per block: its DTensors sharded again on dp
        return fully_shard(model, mesh=mesh["dp"])      # the root: embeddings, final layernorm, head

    def loss(self, xb, yb):
        return TinyGPT.loss(self.model(xb), yb)         # on Shard(-1) logits, under loss_parallel

    @contextlib.contextmanager
    def micro_batch(self):
        # A fresh counter per micro-batch: one CommDebugMode around two FSDP2 forwards loses its module stack
        # (IndexError in the second forward, torch 2.13).
        counter = FunctionalCollectiveCounter() if self.count_collectives else contextlib.nullcontext()
        with counter, loss_parallel():
            yield

    def state_tensors(self):
        return Strategy.state_tensors(self)             # DTensors: tensor_bytes counts their local shards
