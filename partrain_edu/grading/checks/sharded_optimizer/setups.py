"""Check `sharded_optimizer`, what both halves draw from a run's seed (trials.py): three configurations, each a model
of random widths with some parameters frozen, an optimizer class with drawn hyper-parameters, how its parameters
are handed over (model.parameters(), or param groups with their own options) and the group: the default group of
3 ranks twice, the sub-group [1, 2] once. Plus what both halves read off an optimizer: options and state bytes.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.grading.trials import stream

NPROC, STEPS = 3, 3
GROUPS = ((0, 1, 2), (0, 1, 2), (1, 2))   # the group of each configuration, as global ranks
OPTION = {"SGD": "momentum", "Adam": "betas", "AdamW": "betas", "RMSprop": "alpha"}   # each class's own option


class _Net(nn.Module):
    """Mixed shapes and sizes: an input projection, Linear weights and biases, maybe a LayerNorm, a 0-D temperature,
    and a buffer that no optimizer may touch."""

    def __init__(self, widths: tuple[int, ...], norm: bool):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(widths[0], widths[1]) * 0.3)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths[1:]))
        self.norm = nn.LayerNorm(widths[2]) if norm else None
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.linspace(-0.5, 0.5, widths[-1]))

    def forward(self, x):
        h = x @ self.embed
        for i, layer in enumerate(self.layers):
            h = layer(h)
            h = self.norm(h) if i == 0 and self.norm is not None else h
            h = F.gelu(h) if i < len(self.layers) - 1 else h
        return h / self.temperature + self.shift


@dataclass(frozen=True)
class Setup:
    widths: tuple[int, ...]
    norm: bool
    frozen: tuple[int, ...]    # positions in model.parameters() with requires_grad=False
    kind: str                  # the torch.optim class
    defaults: tuple            # (option, value) pairs: the keyword arguments
    groups: tuple              # ((positions, ((option, value), ...)), ...); empty: model.parameters() itself
    ranks: tuple[int, ...]     # the group, global ranks
    seed: int

    @property
    def cls(self) -> type:
        return getattr(torch.optim, self.kind)

    @property
    def name(self) -> str:
        where = "model.parameters()" if not self.groups else f"{len(self.groups)} param groups"
        group = "" if len(self.ranks) == NPROC else f", group {list(self.ranks)}"
        return f"{self.kind} over {where}{group}"

    @property
    def keys(self) -> tuple[str, ...]:
        """The options compared per parameter: lr, weight_decay and every one this configuration sets."""
        return tuple(sorted({"lr", "weight_decay", *dict(self.defaults)}))

    def model(self) -> _Net:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            net = _Net(self.widths, self.norm)
        for k, p in enumerate(net.parameters()):
            p.requires_grad_(k not in self.frozen)
        return net

    def params_arg(self, model: nn.Module):
        """What the optimizer is given: param-group dicts (each with its own options), or the generator itself."""
        if not self.groups:
            return model.parameters()
        params = list(model.parameters())
        return [{"params": [params[k] for k in positions], **dict(options)} for positions, options in self.groups]

    def batch(self, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed + 7919 * step + 104729 * rank)
        return torch.randn(4, self.widths[0], generator=gen), torch.randn(4, self.widths[-1], generator=gen)


def setups(seed: int) -> list[Setup]:
    rnd, out = stream(seed, "sharded_optimizer"), []
    for ranks, kind in zip(GROUPS, rnd.sample(sorted(OPTION), len(GROUPS)), strict=True):
        widths = (rnd.randint(3, 8), rnd.randint(4, 10), *(rnd.randint(3, 12) for _ in range(rnd.randint(1, 2))),
                  rnd.randint(2, 5))
        norm = rnd.random() < 0.5
        with torch.random.fork_rng(devices=[]):   # the caller's random state stays as it was
            shapes = [tuple(p.shape) for p in _Net(widths, norm).parameters()]
        frozen = tuple(sorted(rnd.sample(range(len(shapes)), rnd.randint(1, 2))))
        defaults = _defaults(kind, round(rnd.uniform(0.005, 0.05), 4), rnd)
        out.append(Setup(widths, norm, frozen, kind, tuple(defaults.items()), _groups(shapes, defaults["lr"], rnd),
                         ranks, rnd.randrange(2**31)))
    return out


def _defaults(kind: str, lr: float, rnd) -> dict:
    decay = rnd.choice([0.0, 0.01, 0.05])
    if kind == "SGD":
        return {"lr": 4 * lr, "momentum": round(rnd.uniform(0.5, 0.95), 2), "nesterov": rnd.random() < 0.5,
                "weight_decay": decay}
    if kind == "RMSprop":
        # a small lr: RMSprop's first steps are lr / sqrt(1 − alpha) long, and long steps amplify rounding
        return {"lr": round(lr / 5, 5), "alpha": round(rnd.uniform(0.8, 0.95), 2),
                "momentum": rnd.choice([0.0, 0.5, 0.9]), "centered": rnd.random() < 0.5, "weight_decay": decay}
    return {"lr": lr, "betas": (round(rnd.uniform(0.8, 0.95), 2), round(rnd.uniform(0.95, 0.999), 3)),
            "weight_decay": decay, "amsgrad": rnd.random() < 0.3}


def _groups(shapes: list[tuple], lr: float, rnd) -> tuple:
    """No groups (model.parameters()); GPT-style weight decay on the 2-D weights only; or 3 runs of consecutive
    parameters, each with its own lr."""
    layout = rnd.choice(["parameters", "decay", "layers"])
    if layout == "parameters":
        return ()
    if layout == "decay":
        weights = tuple(k for k, shape in enumerate(shapes) if len(shape) == 2)
        rest = tuple(k for k in range(len(shapes)) if k not in weights)
        return ((weights, (("weight_decay", rnd.choice([0.05, 0.1])),)),
                (rest, (("weight_decay", 0.0), ("lr", round(lr * rnd.uniform(1.5, 3), 5)))))
    a, b = sorted(rnd.sample(range(1, len(shapes)), 2))
    return tuple((tuple(range(lo, hi)), (("lr", round(lr * rnd.uniform(0.5, 3), 5)),))
                 for lo, hi in ((0, a), (a, b), (b, len(shapes))))


def _plain(value):  # an option as JSON: numbers as floats, betas as a list, a flag as its word
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value[:4]]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)[:40]


def options_of(optim, index: dict, keys: tuple[str, ...]) -> list:
    """Per parameter of the model: the options `keys` of the inner group stepping it, or None."""
    out = [None] * len(index)
    for g in getattr(optim, "param_groups", []):
        for p in g.get("params", []):
            if id(p) in index:
                out[index[id(p)]] = {k: _plain(g.get(k)) for k in keys}
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
