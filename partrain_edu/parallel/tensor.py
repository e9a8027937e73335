"""Tensor parallelism (张量并行) over any module: a declarative plan splits its nn.Linear / nn.Embedding layers.

    parallelize(mlp, {"0": "colwise", "2": "rowwise"}, group)     # mlp = nn.Sequential(Linear, GELU, Linear)

**Sharded** (Shoeybi et al. 2019, "Megatron-LM", §3), t ranks: "colwise" keeps out/t output features of a Linear
(eq. 3, Y_r = X·A_r: no sync before a nonlinearity), "rowwise" in/t input features (eq. 5, Y = Σ_r X_r·A_r, bias
whole), "vocab" V/t rows of an Embedding. Everything else stays whole on every rank (`full_slice` maps a shard back).
**Sent** (tp_comm.py): f where activations enter a split region (all-reduce of dL/dX backward), g in each rowwise
layer and vocab embedding (all-reduce forward). A colwise → rowwise pair on (b, s, h) sends, per rank (ring),
    2 · 2(t−1)/t · b·s·h·e bytes      (e bytes per element; an attention + MLP layer: 4 all-reduces)
f runs before each colwise layer by default; `inputs=("attn",)` runs it once on a module's input, shared by the
colwise layers inside (q, k, v: one all-reduce instead of three). A vocab-split head's loss:
`vocab_parallel_cross_entropy` (3 all-reduces of b·s, never the (b, s, V) logits).
**Your modules**: read a split layer's width from its weight (attention: heads = q.weight.shape[0] // head_dim,
as TinyGPT does; torchtitan sets n_heads //= tp); under sequence parallelism look learned positions up through
`region.positions`. TinyGPT's plan and the `tp` strategy: strategies/tensor.py.
"""
from __future__ import annotations

import math
from fnmatch import fnmatch

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.parallel import clipping
from partrain_edu.parallel.tp_comm import all_reduce_, copy_to_tensor_parallel, reduce_from_tensor_parallel

# style → (the layer type it splits, the width it splits, that width in words)
STYLES = {"colwise": (nn.Linear, "out_features", "output features"),
          "rowwise": (nn.Linear, "in_features", "input features"),
          "vocab": (nn.Embedding, "num_embeddings", "rows")}


def _shard(full: torch.Tensor, dim: int, region: TensorParallelRegion) -> nn.Parameter:
    part = nn.Parameter(full.detach().chunk(region.size, dim)[region.rank].clone())
    part.tp_split_dim = dim  # marks a split parameter, as Megatron's `tensor_model_parallel` attribute does
    clipping.mark_on_accumulate(part, clipping.TENSOR_PARALLEL)  # its gradient's norm is a slice's: refused
    return part


def _whole(full: torch.Tensor | None) -> nn.Parameter | None:
    return None if full is None else nn.Parameter(full.detach().clone())


def full_slice(full: torch.Tensor, local: nn.Parameter, region) -> torch.Tensor:
    """The part of a full-model tensor (a weight or its gradient) that the parameter `local` holds here
    (`region`: the region or group it was split over)."""
    dim = getattr(local, "tp_split_dim", None)
    region = as_region(region)
    return full if dim is None else full.chunk(region.size, dim)[region.rank]


def as_region(region) -> TensorParallelRegion:
    """`region` itself, or the default (Megatron's f and g) region over a process group (None: the world)."""
    return region if isinstance(region, TensorParallelRegion) else TensorParallelRegion(region)


class TensorParallelRegion:
    """Where the tensor-parallel ranks meet: f on the way into a split region, g on the way out (Megatron).
    Layers only call `enter` / `exit`; sequence.py swaps in the sequence-parallel pair. Pass the group
    explicitly (no global state): a notebook that re-runs a cell builds a new region on a new group."""

    sequence_parallel = False

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)

    def enter(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, H) → (B, T, H)
        return copy_to_tensor_parallel(x, self.group)  # f

    def exit(self, y: torch.Tensor) -> torch.Tensor:  # (B, T, H) partial sums → (B, T, H)
        return reduce_from_tensor_parallel(y, self.group)  # g

    def positions(self, embedding: nn.Embedding) -> nn.Module:
        """A learned position embedding (looked up by position, not by token): whole here, every rank sees every
        position; `SequenceParallelRegion` looks up this rank's positions only."""
        return embedding

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


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, region) -> torch.Tensor:
    """Mean cross-entropy of vocab-split logits (…, V/t) against targets (…) in the whole vocabulary: equals
    F.cross_entropy of the gathered logits. `region`: the region or group the head was split over."""
    per_token = _VocabParallelCrossEntropy.apply(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                                 as_region(region).group)
    return per_token.mean()


def check_plan(module: nn.Module, plan: dict[str, str], tp: int, inputs=()) -> dict[str, str]:
    """{submodule name: style} for every submodule `plan` ({name pattern: style}; the first pattern that matches a
    name wins) splits, or a one-line ValueError naming the fix. Needs no process group."""
    named = dict(module.named_modules())
    layers = [n for n, m in named.items() if isinstance(m, (nn.Linear, nn.Embedding))]
    for pattern, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r} for {pattern!r}: use one of {', '.join(STYLES)}")
    for what, pattern in [*(("plan pattern", p) for p in plan), *(("inputs pattern", p) for p in inputs)]:
        if not any(_matches(name, pattern) for name in named):
            raise ValueError(f"{what} {pattern!r} matches no submodule of {type(module).__name__}: use its "
                             f"submodule names, e.g. {', '.join(layers[:3]) or ', '.join(list(named)[1:4])}")
    styles = {}
    for name, sub in named.items():
        style = next((s for pattern, s in plan.items() if _matches(name, pattern)), None)
        if style is None:
            continue
        kind = STYLES[style][0]
        if not isinstance(sub, kind):
            raise ValueError(f"{name!r} is a {type(sub).__name__}, but {style!r} splits an nn.{kind.__name__}: point "
                             f"the pattern at nn.{kind.__name__} layers only")
        styles[name] = style
    widths = {name: getattr(named[name], STYLES[style][1]) for name, style in styles.items()}
    common = math.gcd(*widths.values()) if widths else 1
    for name, width in widths.items():
        if width % tp:
            fits = ", ".join(str(d) for d in range(1, common + 1) if common % d == 0)
            raise ValueError(f"tp={tp} does not divide the {width} {STYLES[styles[name]][2]} of {name!r}: every "
                             f"rank needs an equal slice; use tp={fits}")
    entries = _entries(named, inputs)
    for name in entries:
        outer = next((e for e in entries if _within(name, e) and e != name), None)
        if outer is not None:
            raise ValueError(f"inputs entries {outer!r} and {name!r} nest: f would run twice on one path and sum "
                             "its gradient tp times over; keep the inner one")
        if not any(style == "colwise" and _within(n, name) for n, style in styles.items()):
            raise ValueError(f"inputs entry {name!r} holds no colwise layer: f there would sum its whole input "
                             "gradient tp times; list only modules whose colwise layers share their input")
    return styles


def _matches(name: str, pattern: str) -> bool:
    """`blocks.*.attn.q` matches `blocks.3.attn.q`: fnmatch part by part (`*` never spans a dot), as DTensor's
    `parallelize_module` reads the same plan."""
    parts, wanted = name.split("."), pattern.split(".")
    return bool(name) and len(parts) == len(wanted) and all(fnmatch(a, b) for a, b in zip(parts, wanted, strict=True))


def _entries(names, inputs) -> list[str]:
    """The submodules matching a pattern in `inputs`: where f runs, once, for the colwise layers inside."""
    return [n for n in names if any(_matches(n, p) for p in inputs)]


def _within(name: str, outer: str) -> bool:
    return name == outer or name.startswith(outer + ".")


def parallelize(module: nn.Module, plan: dict[str, str], region, inputs=None) -> nn.Module:
    """Split `module` in place across `region`'s ranks following `plan`, and return it.

    `plan`: {submodule name pattern: style}, `*` standing for one part of a dotted name (`blocks.*.mlp.fc`).
    `region`: a TensorParallelRegion, a SequenceParallelRegion or a process group (the default region over it).
    Each planned layer is replaced by its split version under the same name (so `full_slice` maps every shard
    to the full model's tensor); the module's own forward runs unchanged. f (region.enter) runs in a forward
    pre-hook on the input of each module matching a pattern in `inputs`, and of every colwise layer outside
    them. A "rowwise" layer's input must be split (a colwise layer's output); its output is whole again.
    """
    region = as_region(region)
    inputs = tuple(inputs or ())
    styles = check_plan(module, plan, region.size, inputs)
    split = {"colwise": ColumnParallelLinear, "rowwise": RowParallelLinear, "vocab": VocabParallelEmbedding}
    for name, style in styles.items():
        parent, _, attr = name.rpartition(".")
        setattr(module.get_submodule(parent), attr, split[style](module.get_submodule(name), region))
    entries = _entries(dict(module.named_modules()), inputs)
    entries += [n for n, style in styles.items() if style == "colwise" and not any(_within(n, e) for e in entries)]
    for name in entries:
        module.get_submodule(name).register_forward_pre_hook(lambda _m, args: (region.enter(args[0]), *args[1:]))
    return module
