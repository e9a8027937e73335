"""Tensor parallelism (张量并行), Megatron-style: every layer's weight matrices split across the ranks.

    partrain-edu train --strategy tp --nproc 2 --tp 2 --steps 20 --json

**Sharded** (Shoeybi et al. 2019, "Megatron-LM", §3). With t ranks, each holds 1/t of every big matrix:
- MLP: `fc` column-parallel (A = [A_1 … A_t], rank r computes GeLU(X·A_r) — no sync needed before the
  nonlinearity, eq. 3), then `proj` row-parallel (rank r multiplies its slice of the hidden features, the
  partial products are summed). One all-reduce in forward (g), one in backward (f).
- Attention: `q`, `k`, `v` column-parallel *by heads* (rank r computes whole heads n_head/t, Figure 3b; TinyGPT's
  attention counts its heads from q's width, so the same attention code runs on a shard), `proj` row-parallel.
- The embedding table by vocabulary rows, the output head by vocabulary columns, and a vocab-parallel
  cross-entropy that never gathers the (B, T, V) logits (Megatron §3, "input and output embedding").
- LayerNorms, position embeddings and row-parallel biases stay whole on every rank (replicated).

**Communicated** (tp_comm.py). Per transformer layer and micro-batch: 2 all-reduces forward (g after attention
and after the MLP) and 2 backward (f before them), each of b·s·h elements — `theory.traffic`'s "tp":

    bytes sent per rank per layer = 4 · 2(t−1)/t · b·s·h·e     (ring all-reduce, e bytes per element)

Outside the layers: 1 forward all-reduce of b·s·h for the embedding (g), 1 backward for the head's input (f),
and 3 forward all-reduces of b·s for the loss (the max logit, the target's logit, the softmax denominator).

**Equivalence**: `parallelize(TinyGPT(...), region)` copies each rank's slices out of a full model, keeping
TinyGPT's parameter names, so a shard's weight or gradient can be compared with `full_slice` of the full one.
"""
from __future__ import annotations

import math
from fnmatch import fnmatch

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.data import split_microbatches
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.parallel.tp_comm import all_reduce_, copy_to_tensor_parallel, reduce_from_tensor_parallel
from partrain_edu.train import Strategy, TrainConfig, register

# How each weight is split: module-name pattern → style (a declarative plan, as in torchtitan). torch_tp.py
# turns the same dict into DTensor's ColwiseParallel / RowwiseParallel, so the two versions split alike.
TP_PLAN = {
    "wte": "vocab",                                       # embedding rows: V/t tokens per rank
    "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",  # by heads
    "blocks.*.attn.proj": "rowwise",
    "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise",
    "head": "colwise",                                    # output columns: V/t logits per rank
}
# Modules whose input enters a split region: f runs once on it, shared by q, k and v (or fc, or the head).
REGION_INPUTS = ("blocks.*.attn", "blocks.*.mlp", "head")


def plan_style(name: str) -> str | None:
    return next((style for pattern, style in TP_PLAN.items() if fnmatch(name, pattern)), None)


def check_divisible(cfg: GPTConfig, tp: int, sequence_parallel: bool = False) -> None:
    """One-line ValueError naming the fix unless every dimension tensor parallelism splits divides by tp."""
    sizes = [("hidden size", cfg.n_embd), ("number of attention heads", cfg.n_head), ("vocabulary", cfg.vocab_size)]
    if sequence_parallel:
        sizes.append(("sequence length", cfg.seq_len))
    common = math.gcd(*(n for _, n in sizes))
    fits = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
    for what, n in sizes:  # the hidden size first: heads | hidden, so a tp that misses it misses the heads too
        if n % tp:
            raise ValueError(f"--tp {tp} does not divide the {what} ({n}): every rank needs an equal slice; "
                             f"use --tp {fits}")


def _shard(full: torch.Tensor, dim: int, region: TensorParallelRegion) -> nn.Parameter:
    part = nn.Parameter(full.detach().chunk(region.size, dim)[region.rank].clone())
    part.tp_split_dim = dim  # marks a split parameter, as Megatron's `tensor_model_parallel` attribute does
    return part


def _whole(full: torch.Tensor | None) -> nn.Parameter | None:
    return None if full is None else nn.Parameter(full.detach().clone())


def full_slice(full: torch.Tensor, local: nn.Parameter, region: TensorParallelRegion) -> torch.Tensor:
    """The part of a full-model tensor (a weight or its gradient) that the parameter `local` holds here."""
    dim = getattr(local, "tp_split_dim", None)
    return full if dim is None else full.chunk(region.size, dim)[region.rank]


class TensorParallelRegion:
    """Where the tensor-parallel ranks meet: f on the way into a split region, g on the way out (Megatron).
    Layers only call `enter` / `exit`; sequence.py swaps in the sequence-parallel pair. Pass the group
    explicitly (no global state): a notebook that re-runs a cell builds a new region on a new group."""

    sequence_parallel = False

    def __init__(self, group):
        self.group, self.rank, self.size = group, dist.get_rank(group), dist.get_world_size(group)

    def enter(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) → (B, T, H)
        return copy_to_tensor_parallel(x, self.group)  # f

    def exit(self, y: torch.Tensor) -> torch.Tensor:  # (B, T, H) partial sums → (B, T, H)
        return reduce_from_tensor_parallel(y, self.group)  # g

    def positions(self, wpe: nn.Embedding) -> nn.Module:
        return wpe  # every rank sees every position

    def finish_grads(self, model: nn.Module) -> None:
        """Nothing to do: f and g already give replicated parameters the same full gradient on every rank."""

    def pack(self, t: torch.Tensor):  # what autograd keeps of an activation saved for backward
        return t

    def unpack(self, kept) -> torch.Tensor:
        return kept

    def saving(self, meter=None):
        """Wrap a forward pass: autograd keeps activations through `pack`/`unpack`; a `meter` (sequence.SavedBytes)
        counts what is kept."""
        pack = self.pack if meter is None else (lambda t: meter.keep(self.pack(t)))
        return torch.autograd.graph.saved_tensors_hooks(pack, self.unpack)


class ColumnParallelLinear(nn.Linear):
    """Y_r = X·A_r + b_r (Megatron eq. 3): rank r holds out/t output features, rows of nn.Linear's (out, in)
    weight. Its input must already be inside the region (after f); its output stays split, (…, out/t)."""

    def __init__(self, full: nn.Linear, region: TensorParallelRegion):
        # device="meta": no random init to draw (and no change to the global RNG); the weights are copied in.
        super().__init__(full.in_features, full.out_features // region.size, bias=full.bias is not None,
                         device="meta")
        self.weight = _shard(full.weight, 0, region)  # (out/t, in)
        self.bias = None if full.bias is None else _shard(full.bias, 0, region)  # (out/t,)


class RowParallelLinear(nn.Linear):
    """Y = Σ_r X_r·A_r + b (Megatron eq. 5): rank r holds in/t input features, columns of the weight, and
    multiplies the matching slice X_r of the split input; the region's exit (g) sums the partial products.
    The bias is added once, after the sum, so every rank holds it whole."""

    def __init__(self, full: nn.Linear, region: TensorParallelRegion):
        super().__init__(full.in_features // region.size, full.out_features, bias=full.bias is not None,
                         device="meta")
        self.region = region
        self.weight = _shard(full.weight, 1, region)  # (out, in/t)
        self.bias = _whole(full.bias)  # (out,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (…, in/t)
        y = self.region.exit(F.linear(x, self.weight))  # (…, out), summed over ranks
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Rank r holds the rows of tokens [r·V/t, (r+1)·V/t). A token outside that range looks up zeros here;
    exactly one rank holds each token, so the region's exit (g) sums to the full embedding E[idx]."""

    def __init__(self, full: nn.Embedding, region: TensorParallelRegion):
        super().__init__(full.num_embeddings // region.size, full.embedding_dim, device="meta")
        self.region = region
        self.weight = _shard(full.weight, 0, region)  # (V/t, H)
        self.vocab_start = region.rank * self.num_embeddings

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (B, T) ids in the whole vocabulary
        local = idx - self.vocab_start
        elsewhere = (local < 0) | (local >= self.num_embeddings)  # (B, T): rows another rank holds
        x = F.embedding(local.masked_fill(elsewhere, 0), self.weight)  # (B, T, H)
        return self.region.exit(x.masked_fill(elsewhere[..., None], 0.0))  # (B, T, H); (B, T/t, H) under SP


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits split by vocabulary columns, without gathering them (Megatron §3): three
    all-reduces of one number per token replace an all-gather of V/t numbers per token."""

    @staticmethod
    def forward(ctx, logits, targets, group):  # (N, V/t) this rank's columns, (N,) ids in the whole vocabulary
        part = logits.shape[-1]
        # 1. the largest logit over the whole vocabulary, for a stable softmax
        top = all_reduce_(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)  # (N,)
        shifted = logits - top[:, None]  # (N, V/t)
        # 2. the target's logit: one rank holds each target's column, the others contribute 0
        local = targets - dist.get_rank(group) * part
        mine = (local >= 0) & (local < part)  # (N,)
        local = local.clamp(0, part - 1)
        target_logit = all_reduce_(torch.where(mine, shifted.gather(1, local[:, None]).squeeze(1), 0.0), group)
        # 3. the softmax denominator Σ_v exp(logit_v): partial sums over this rank's columns, then over ranks
        exp = shifted.exp()  # (N, V/t)
        sum_exp = all_reduce_(exp.sum(dim=-1), group)  # (N,)
        ctx.save_for_backward(exp.div_(sum_exp[:, None]), local, mine)  # this rank's columns of the softmax
        return sum_exp.log() - target_logit  # (N,) −log softmax(target), identical on every rank

    @staticmethod
    def backward(ctx, grad):  # (N,)
        softmax, local, mine = ctx.saved_tensors
        # d loss / d logit_v = softmax_v − [v = target], on this rank's columns only: no communication
        grad_logits = softmax.scatter_add(1, local[:, None], -mine.to(softmax.dtype)[:, None])
        return grad_logits * grad[:, None], None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 region: TensorParallelRegion) -> torch.Tensor:
    """Mean next-token loss from vocab-split logits (B, T, V/t) and targets (B, T): equals TinyGPT.loss."""
    per_token = _VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                                 region.group)
    return per_token.mean()


def parallelize(model: TinyGPT, region: TensorParallelRegion) -> TinyGPT:
    """Split a full TinyGPT in place across the region's ranks following TP_PLAN, and return it.

    The module tree and parameter names stay TinyGPT's (a shard is compared with the full model through
    `full_slice`); its forward is TinyGPT's own, with f (or the sequence all-gather) run by a forward pre-hook
    where an input enters a split region. The output is vocab-split logits: use vocab_parallel_cross_entropy.
    """
    check_divisible(model.cfg, region.size, region.sequence_parallel)
    styles = {"colwise": ColumnParallelLinear, "rowwise": RowParallelLinear, "vocab": VocabParallelEmbedding}
    for name, module in list(model.named_modules()):
        style = plan_style(name)
        if style is not None:
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent), attr, styles[style](module, region))
    for name, module in model.named_modules():
        if any(fnmatch(name, pattern) for pattern in REGION_INPUTS):
            module.register_forward_pre_hook(lambda _module, args: (region.enter(args[0]), *args[1:]))
    model.wpe = region.positions(model.wpe)
    return model


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
        self.region = self.region_type(dist.new_group(list(range(self.tp))))  # dp = pp = 1: every rank
        return parallelize(self.new_model(), self.region)

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
