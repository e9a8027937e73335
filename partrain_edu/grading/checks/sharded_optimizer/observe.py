"""Check `sharded_optimizer`, what both halves share — the model, its batches, the three runs — and the observe
half, which runs on the 2 ranks beside the learner's `make_sharded_optimizer` (see the package's docstring).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.observations import tensor, traffic

STEPS, SEED = 3, 9


class _Net(nn.Module):
    """Mixed shapes and sizes: a frozen input projection (pretrained, requires_grad=False), Linear weights and
    biases, LayerNorm, a 0-D temperature, and a buffer that no optimizer may touch."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(8, 12) * 0.3, requires_grad=False)
        self.fc1 = nn.Linear(12, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.linspace(-0.5, 0.5, 4))

    def forward(self, x):
        h = self.norm(F.gelu(self.fc1(x @ self.embed)))
        h = h + torch.tanh(self.fc2(h))
        return self.head(h) / self.temperature + self.shift


def make_model() -> _Net:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return _Net()


def batch_of(run: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1000 + 100 * run + 10 * step + rank)
        return torch.randn(4, 8), torch.randn(4, 4)


@dataclass(frozen=True)
class _Run:
    name: str
    cls: type
    defaults: dict
    groups: tuple | None  # options of (the 2-D weights, the rest); None: model.parameters() as it comes
    option: str           # the class's own option reported besides lr and weight_decay


RUNS = (
    _Run("AdamW over two param groups", torch.optim.AdamW, {"lr": 1e-2, "betas": (0.9, 0.95)},
         ({"weight_decay": 0.1}, {"lr": 3e-2, "weight_decay": 0.0}), "betas"),
    _Run("SGD-momentum over two param groups", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9},
         ({"weight_decay": 0.1}, {"lr": 0.15, "weight_decay": 0.0}), "momentum"),
    _Run("SGD-momentum over model.parameters()", torch.optim.SGD,
         {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}, None, "momentum"),
)
_REFERENCE = make_model()
NAMES = [name for name, _ in _REFERENCE.named_parameters()]
FROZEN = {k for k, p in enumerate(_REFERENCE.parameters()) if not p.requires_grad}
SIZES = [p.numel() * p.element_size() for p in _REFERENCE.parameters()]
TRAINABLE_BYTES = sum(b for k, b in enumerate(SIZES) if k not in FROZEN)


def params_arg(run: _Run, model: nn.Module):
    """What the optimizer is given: GPT-style groups (weight decay on the 2-D weights only), or a generator."""
    if run.groups is None:
        return model.parameters()
    weights = [p for p in model.parameters() if p.dim() == 2]  # the frozen projection among them
    rest = [p for p in model.parameters() if p.dim() != 2]
    return [{"params": weights, **run.groups[0]}, {"params": rest, **run.groups[1]}]


def _plain(value):  # an option as JSON: numbers as floats, betas as a list
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value[:4]]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)[:40]


def options_of(optim, index: dict, option: str) -> list:
    """Per parameter of the model: the lr, weight_decay and `option` of the inner group stepping it, or None."""
    out = [None] * len(index)
    for g in getattr(optim, "param_groups", []):
        for p in g.get("params", []):
            if id(p) in index:
                out[index[id(p)]] = {k: _plain(g.get(k)) for k in ("lr", "weight_decay", option)}
    return out


def state_bytes(optim, index: dict) -> tuple[list[int], int]:
    """Bytes of optimizer state per parameter of the model, and under keys that are not its parameters."""
    per, foreign = [0] * len(index), 0
    for key, state in dict(getattr(optim, "state", {})).items():
        held = sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor)) \
            if isinstance(state, dict) else 0
        if id(key) in index:
            per[index[id(key)]] += held
        else:
            foreign += held
    return per, foreign


def observe(ctx, make_sharded_optimizer, *, seed: int) -> list[dict]:
    runs = []
    for i, run in enumerate(RUNS):
        model = make_model()
        params = list(model.parameters())
        index = {id(p): k for k, p in enumerate(params)}
        opt = make_sharded_optimizer(params_arg(run, model), run.cls, group=None, **run.defaults)
        steps = []
        for step in range(STEPS):
            opt.zero_grad()
            left = [k for k, p in enumerate(params) if p.grad is not None and bool(p.grad.ne(0).any())]
            for p in params:
                p.grad = None  # reported above; this step's gradient alone from here on
            x, y = batch_of(i, step, ctx.rank)
            F.mse_loss(model(x), y).backward()
            for p in params:  # data parallelism's job, done here, outside the traced window
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= ctx.world_size
            with CommTracer() as tracer:
                opt.step()
            per, foreign = state_bytes(getattr(opt, "optim", None), index)
            steps.append({"left": left, "params": [tensor(p) for p in params], "buffer": tensor(model.shift),
                          "state": per, "foreign": foreign, **traffic(tracer),
                          "received": sum(r.received for r in tracer.records)})
        inner = getattr(opt, "optim", None)
        options = options_of(inner, index, run.option)
        owned = [None] * ctx.world_size  # who steps what, gathered untraced for the partition check
        dist.all_gather_object(owned, [k for k, o in enumerate(options) if o is not None])
        runs.append({"optim": None if inner is None else type(inner).__name__[:60],
                     "is_class": isinstance(inner, run.cls), "owned": owned, "options": options, "steps": steps})
    return runs
