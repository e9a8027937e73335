"""Exercise 05, Megatron tensor parallelism (张量并行) on 2 ranks: the conjugate pair f (identity forward,
all-reduce backward) and g (all-reduce forward, identity backward) as four functions, then the column → row
parallel MLP Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2, with W1 split by rows and W2 by columns, using the reference
f and g.

Graded: `tp_f_g` — each of the four returns the identity or the sum over ranks, with exactly the one all-reduce
it owes; `tp_mlp` — Y and every gradient (dL/dX and each rank's weight shards, L = Σ Y·w with fixed weights)
equal the unsharded MLP's, with one all-reduce in forward (g) and one in backward (f).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import register

FG_NAMES = ("f forward", "f backward", "g forward", "g backward")
MLP_HIDDEN = 8


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


def observe_f_g(ctx, *functions: Callable, seed: int) -> list[dict]:
    x = fg_input(ctx.rank)
    calls = []
    for fn in functions:  # in the order of FG_NAMES
        with CommTracer() as tracer:
            out = fn(x.clone(), None)
        calls.append({"out": tensor(out), "calls": len(tracer.records), **traffic(tracer)})
    return calls


FG_HINTS = {"f forward": "f's forward is the identity: every rank already holds the whole X. An all-reduce "
                         "here is g's forward — f and g are swapped?",
            "f backward": "f's backward all-reduces dL/dX: every rank's column slice used all of X, so the "
                          "gradient is the sum of every rank's contribution",
            "g forward": "g's forward all-reduces: the row-parallel partial products sum to Y",
            "g backward": "g's backward is the identity: each partial product fed Y with weight 1. An "
                          "all-reduce here is f's backward — f and g are swapped?"}


@register("tp_f_g", nproc=2, arity=4, observe=observe_f_g,
          summary="f is identity forward / all-reduce backward and g is all-reduce "
          "forward / identity backward (Megatron's conjugate pair), one all-reduce each")
def verify_f_g(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    x = fg_input(me)
    summed = torch.stack([fg_input(r) for r in range(n)]).sum(0)
    for what, seen in zip(FG_NAMES, observed.items(len(FG_NAMES))):
        reduces = what in ("f backward", "g forward")
        problem = differ(what, summed if reduces else x, seen["out"].tensor())
        if problem:
            return [f"{problem}. Hint: {FG_HINTS[what]}"]
        ops, calls, want = seen["ops"].counts(), seen["calls"].count(), int(reduces)
        if ops.get("all_reduce", 0) != want or calls != want:
            return [f"{what}: made {calls} collective call(s) {ops}; expected {want} all-reduce"]
    return []


class _F(torch.autograd.Function):  # the reference f and g handed to the learner's MLP
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def observe_mlp(ctx, parallel_mlp, *, seed: int) -> dict:
    fc, proj, x = mlp_layers()
    cols = mlp_columns(ctx.rank, ctx.world_size)
    w1 = fc.weight.detach()[cols].clone().requires_grad_()       # (4h/t, h): column parallel
    b1 = fc.bias.detach()[cols].clone().requires_grad_()         # (4h/t,)
    w2 = proj.weight.detach()[:, cols].clone().requires_grad_()  # (h, 4h/t): row parallel
    b2 = proj.bias.detach().clone().requires_grad_()             # (h,): added once, after g
    x = x.clone().requires_grad_()
    with CommTracer() as tracer:
        y = parallel_mlp(x, w1, b1, w2, b2, None, lambda v, group=None: _F.apply(v),
                         lambda v, group=None: _G.apply(v))
        forward_calls = len(tracer.records)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            (y * loss_weights(y)).sum().backward()
    return {"y": tensor(y), "forward_calls": forward_calls, **traffic(tracer),
            "grads": [tensor(t.grad) for t in (x, w1, b1, w2, b2)]}


@register("tp_mlp", nproc=2, observe=observe_mlp,
          summary="the column→row parallel MLP equals the full MLP in output and in every "
          "gradient (dL/dX and each weight shard), with one all-reduce forward and one backward",
          deadlock_hint="Likely: a rank skips f or g, or calls a collective the other rank does not.")
def verify_mlp(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    fc, proj, x = mlp_layers()
    x.requires_grad_()
    with torch.enable_grad():
        y_full = proj(F.gelu(fc(x)))
        (y_full * loss_weights(y_full)).sum().backward()
    y_full, bias = y_full.detach(), proj.bias.detach()
    y = observed["y"].tensor()
    problem = differ("output Y", y_full, y)
    if problem:
        r = ratio_of(y_full - bias, y - bias) if isinstance(y, torch.Tensor) and y.shape == y_full.shape else None
        return [problem + (". Hint: Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2 — the bias b2 is added once, after g"
                           if r is None else f". Off by {r:.3g}×: is a sum missing or doubled?")]
    cols = mlp_columns(me, n)
    expected = [("dL/dX", x.grad, "f must wrap X so its backward sums every rank's dL/dX"),
                ("dL/dW1 (your column shard)", fc.weight.grad[cols], "W1 is split by output rows"),
                ("dL/db1", fc.bias.grad[cols], "b1 is split like W1's rows"),
                ("dL/dW2 (your row shard)", proj.weight.grad[:, cols], "W2 is split by input columns"),
                ("dL/db2", proj.bias.grad, "add b2 after g, once")]
    for (what, want, hint), got in zip(expected, observed["grads"].items(len(expected))):
        problem = differ(what, want, got.tensor())
        if problem:
            return [f"{problem}. Hint: {hint}"]
    forward_calls, calls = observed["forward_calls"].count(), observed["ops"].counts().get("all_reduce", 0)
    if (forward_calls, calls) != (1, 2):
        return [f"{forward_calls} collective(s) in forward and {calls} all-reduces in all; a Megatron MLP makes "
                "exactly one in forward (g) and one in backward (f)"]
    return []
