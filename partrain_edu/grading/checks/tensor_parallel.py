"""Exercise 05, Megatron tensor parallelism (张量并行): the conjugate pair f (identity forward, all-reduce
backward) and g (all-reduce forward, identity backward) as four functions, then the column → row parallel MLP
Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2, with W1 split by rows and W2 by columns, using the reference f and g.

Both run on 4 ranks, each configuration on one layout of tensor-parallel groups drawn per run (trials.py): the
default group of all 4 ranks, and splits of the 4 into groups where one group of ≥ 2 does not start at rank 0
(e.g. [0, 2] and [1, 3], or [0] and [1, 2, 3]); every rank runs the learner's function on its own group at once.
Graded: `tp_f_g` — on 4 drawn shapes and layouts, each of the four returns the identity or the sum over the
group's members, leaves the tensor it was given unchanged, and makes exactly the one all-reduce it owes, on the
group; `tp_mlp` — on 3 drawn layouts with drawn batch shapes, widths h and F = t·k and weights, Y and every
gradient (dL/dX and each rank's weight shards, L = Σ Y·w with fixed weights w) equal the unsharded MLP's, with
one all-reduce in forward (g) and one in backward (f), both on the group.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import Problem, register
from partrain_edu.grading.trials import stream

NPROC = 4
# The splits of the 4 ranks into tensor-parallel groups that hold a group of ≥ 2 not starting at rank 0: there
# group rank ≠ global rank, and an all-reduce that leaves out `group` sums over all 4 ranks (without a hang).
SPLITS = (((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2)), ((0,), (1, 2, 3)), ((0,), (1,), (2, 3)),
          ((0,), (2,), (1, 3)), ((0,), (3,), (1, 2)))
WORLD = (tuple(range(NPROC)),)   # the default group (group=None) as a layout
FG_NAMES = ("f forward", "f backward", "g forward", "g backward")
FG_CONFIGS, MLP_CONFIGS = 4, 3


def layouts(seed: int, what: str, count: int) -> list[tuple[tuple[int, ...], ...]]:
    """`count` layouts of run `seed`, in a drawn order: the default group and count − 1 distinct splits."""
    rng = stream(seed, f"{what} layouts")
    chosen = [WORLD, *rng.sample(SPLITS, count - 1)]
    rng.shuffle(chosen)
    return chosen


def generator(seed: int, *what) -> torch.Generator:
    return torch.Generator().manual_seed(stream(seed, " ".join(map(str, what))).getrandbits(63))


def mine(layout: tuple, rank: int) -> tuple[int, tuple[int, ...]]:
    """(index in the layout, members) of the group holding `rank`."""
    return next((j, g) for j, g in enumerate(layout) if rank in g)


def where(layout: tuple, members: tuple[int, ...]) -> str:
    return f"the default group (all {NPROC} ranks)" if layout == WORLD else f"group {list(members)} of {NPROC} ranks"


def make_groups(layout: tuple) -> list:
    """The process group of each group of `layout` (None: the default group); every rank makes every group, in
    the same order, as dist.new_group requires."""
    return [None] if layout == WORLD else [dist.new_group(list(g)) for g in layout]


def calls_of(tracer: CommTracer) -> list[list]:
    """[op, [global ranks of its group]] of every traced call."""
    return [[r.op, list(r.group_ranks)] for r in tracer.records]


def stray_group(calls: list[tuple], members: tuple[int, ...]) -> str:
    """'your all_reduce ran on ranks …' when one of `calls` (op, ranks) left the group of `members`, else ''."""
    return next((f"your {op} ran on ranks {list(ranks)}, not on the group {list(members)}: pass the group you "
                 "were given (group=group) to every collective" for op, ranks in calls if ranks != members), "")


def read_calls(seen: Reader) -> list[tuple]:
    return [(str(op.value)[:40], tuple(ranks.numbers(NPROC))) for op, ranks in
            (call.items(2) for call in seen.entries(64, "calls"))]


# --- tp_f_g ------------------------------------------------------------------------------------------------------

def fg_configs(seed: int) -> list[tuple[tuple, tuple[int, ...]]]:
    """(layout, shape) of each configuration: 1 to 3 dimensions of 1 to 5."""
    rng = stream(seed, "tp_f_g shapes")
    return [(layout, tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 3))))
            for layout in layouts(seed, "tp_f_g", FG_CONFIGS)]


def fg_input(seed: int, config: int, shape: tuple[int, ...], rank: int) -> torch.Tensor:
    return torch.randn(shape, generator=generator(seed, "tp_f_g x", config, rank))


def observe_f_g(ctx, *functions: Callable, seed: int) -> list[list[dict]]:
    out = []
    for k, (layout, shape) in enumerate(fg_configs(seed)):
        group = make_groups(layout)[mine(layout, ctx.rank)[0]]
        x, seen = fg_input(seed, k, shape, ctx.rank), []
        for fn in functions:  # in the order of FG_NAMES
            given = x.clone()
            with CommTracer() as tracer:
                result = fn(given, group)
            seen.append({"out": tensor(result), "given": tensor(given), "calls": calls_of(tracer)})
        out.append(seen)
    return out


FG_RULES = {"f forward": "f's forward is the identity: every rank of the group already holds the whole X",
            "f backward": "f's backward all-reduces dL/dX over the group: every rank's column slice used all of X, "
                          "so the gradient is the sum of every member's contribution",
            "g forward": "g's forward all-reduces over the group: the row-parallel partial products sum to Y",
            "g backward": "g's backward is the identity: each partial product fed Y with weight 1"}
SWAPPED = {"f forward": "an all-reduce here is g's forward — f and g are swapped?",
           "g backward": "an all-reduce here is f's backward — f and g are swapped?"}


def _fg_hint(what: str, got, x: torch.Tensor, summed: torch.Tensor, world: torch.Tensor, members: tuple) -> str:
    """What the wrong result of `what` equals instead, when it equals something telling, and the rule."""
    def equals(t: torch.Tensor) -> bool:
        return isinstance(got, torch.Tensor) and got.shape == t.shape and differ("", t, got) is None

    if len(members) < NPROC and equals(world) and not equals(summed):
        return f" It is the sum over all {NPROC} ranks: pass group=group, so that only {list(members)} take part"
    if what in SWAPPED and len(members) > 1 and (equals(summed) or equals(world)):
        return f" It is a sum over ranks: {SWAPPED[what]} Hint: {FG_RULES[what]}"
    if what not in SWAPPED and len(members) > 1 and equals(x):
        return f" It is your own tensor, unchanged: no all-reduce reached it. Hint: {FG_RULES[what]}"
    return f" Hint: {FG_RULES[what]}"


@register("tp_f_g", nproc=NPROC, arity=4, observe=observe_f_g,
          summary="on drawn shapes and on sub-groups of 4 ranks, f is identity forward / all-reduce backward and g "
          "is all-reduce forward / identity backward (Megatron's conjugate pair), one all-reduce each, on the "
          "group; the tensor given is left unchanged",
          deadlock_hint="Likely: a function makes a collective on one rank that another rank does not make.")
def verify_f_g(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for k, ((layout, shape), seen) in enumerate(zip(fg_configs(seed), observed.items(FG_CONFIGS), strict=True)):
        members = mine(layout, me)[1]
        x = fg_input(seed, k, shape, me)
        summed = sum(fg_input(seed, k, shape, r) for r in members)
        world = sum(fg_input(seed, k, shape, r) for r in range(n))
        at = f"{where(layout, members)}, shape {shape}"
        for j, (what, got) in enumerate(zip(FG_NAMES, seen.items(len(FG_NAMES)), strict=True)):
            reduces = what in ("f backward", "g forward")
            out = got["out"].tensor()
            problem = differ(f"{what} on {at}", summed if reduces else x, out)
            calls = read_calls(got["calls"])
            if problem:
                return [Problem(problem + "." + _fg_hint(what, out, x, summed, world, members), at=(k, j, 0))]
            problem = differ(f"{what} on {at} changed the tensor it was given", x, got["given"].tensor())
            if problem:
                return [Problem(problem + ". Leave it unchanged: an in-place all-reduce (dist.all_reduce(x)) "
                                "overwrites it — all-reduce a clone, autograd and the caller may still need it",
                                at=(k, j, 1))]
            if [op for op, _ in calls] != ["all_reduce"] * reduces:
                made = sorted({op for op, _ in calls})
                return [Problem(f"{what} on {at}: made {len(calls)} collective call(s) {made}; expected "
                                f"{'one all-reduce' if reduces else 'none'}", at=(k, j, 2))]
            if stray_group(calls, members):
                return [Problem(f"{what} on {at}: right values, but {stray_group(calls, members)}", at=(k, j, 2))]
    return []


# --- tp_mlp -------------------------------------------------------------------------------------------------------

class _F(torch.autograd.Function):  # the reference f and g handed to the learner's MLP
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def mlp_configs(seed: int) -> list[dict]:
    """Per configuration: its layout, the leading (batch) dims of X, the width h and the hidden units per rank k
    (a group of t ranks splits F = t·k of them), shared by the layout's groups so that a collective that leaves
    out `group` still meets tensors of its size."""
    rng = stream(seed, "tp_mlp shapes")
    return [{"layout": layout, "lead": tuple(rng.randint(1, 4) for _ in range(rng.randint(1, 2))),
             "h": rng.randint(2, 8), "k": rng.randint(1, 4)} for layout in layouts(seed, "tp_mlp", MLP_CONFIGS)]


def mlp_model(seed: int, config: int, c: dict, group: int) -> list[torch.Tensor]:
    """X, W1 (F, h), b1 (F,), W2 (h, F), b2 (h,) of group `group` of configuration `config`, unsharded."""
    gen, h = generator(seed, "tp_mlp model", config, group), c["h"]
    width = len(c["layout"][group]) * c["k"]
    return [torch.randn(*c["lead"], h, generator=gen), torch.randn(width, h, generator=gen) / math.sqrt(h),
            torch.randn(width, generator=gen), torch.randn(h, width, generator=gen) / math.sqrt(width),
            torch.randn(h, generator=gen)]


def loss_weights(y: torch.Tensor) -> torch.Tensor:
    """L = Σ Y·w with these fixed, distinct weights: every output element gets its own gradient."""
    return torch.arange(y.numel()).reshape(y.shape).sin()


def observe_mlp(ctx, parallel_mlp, *, seed: int) -> list[dict]:
    out = []
    for k, c in enumerate(mlp_configs(seed)):
        j, members = mine(c["layout"], ctx.rank)
        group = make_groups(c["layout"])[j]
        x, w1, b1, w2, b2 = mlp_model(seed, k, c, j)
        cols = slice(members.index(ctx.rank) * c["k"], (members.index(ctx.rank) + 1) * c["k"])
        leaves = [x.clone(), w1[cols].clone(), b1[cols].clone(), w2[:, cols].clone(), b2.clone()]
        for t in leaves:
            t.requires_grad_()
        with CommTracer() as tracer:
            y = parallel_mlp(*leaves, group, lambda v, group=None: _F.apply(v, group),
                             lambda v, group=None: _G.apply(v, group))
            forward = calls_of(tracer)
            if isinstance(y, torch.Tensor) and y.requires_grad:
                (y * loss_weights(y)).sum().backward()
        out.append({"y": tensor(y), "forward": forward, "calls": calls_of(tracer),
                    "grads": [tensor(t.grad) for t in leaves]})
    return out


def _y_hint(y, want: torch.Tensor, partial: torch.Tensor, b2: torch.Tensor, members: tuple, forward: list) -> str:
    """Why Y is wrong, from what it equals instead (`partial`: this rank's own product GeLU(…)·W2ᵀ)."""
    t = len(members)
    if not isinstance(y, torch.Tensor) or y.shape != want.shape:
        return ". Hint: Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2 has X's shape"
    if t > 1 and differ("", want + (t - 1) * b2, y, rtol=1e-4, atol=1e-5) is None:
        return f". It is Y + {t - 1}·b2: b2 went into g on each of the {t} ranks — add it once, after g"
    if t > 1 and differ("", partial + b2, y, rtol=1e-4, atol=1e-5) is None:
        return ". It is only this rank's own partial product + b2: g must sum the partial products over the group"
    if stray_group(forward, members):
        return ". Y is summed over other ranks: " + stray_group(forward, members)
    r = ratio_of(want - b2, y - b2)
    return (f". Off by {r:.3g}× (b2 aside): is a sum missing or doubled?" if r is not None else
            ". Hint: Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2, with your shards of W1, b1 and W2 — b2 added once, after g")


@register("tp_mlp", nproc=NPROC, observe=observe_mlp,
          summary="on drawn widths, batch shapes and sub-groups of 4 ranks, the column→row parallel MLP equals the "
          "full MLP in output and in every gradient (dL/dX and each weight shard), with one all-reduce forward "
          "and one backward, on the group",
          deadlock_hint="Likely: a rank skips f or g, or calls a collective the other ranks do not.")
def verify_mlp(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for k, (c, seen) in enumerate(zip(mlp_configs(seed), observed.items(MLP_CONFIGS), strict=True)):
        j, members = mine(c["layout"], me)
        i, at = members.index(me), f"on {where(c['layout'], members)}"
        x, w1, b1, w2, b2 = [p.double().requires_grad_() for p in mlp_model(seed, k, c, j)]
        cols, alone = slice(i * c["k"], (i + 1) * c["k"]), x.detach().clone().requires_grad_()
        with torch.enable_grad():   # the full MLP; this rank's own partial product and its own share of dL/dX
            y_full = F.gelu(x @ w1.T + b1) @ w2.T + b2
            partial = F.gelu(alone @ w1.detach()[cols].T + b1.detach()[cols]) @ w2.detach()[:, cols].T
            for out in (y_full, partial):
                (out * loss_weights(out)).sum().backward()
        partial = partial.detach()
        y, forward = seen["y"].tensor(), read_calls(seen["forward"])
        problem = differ(f"output Y {at}", y_full.detach(), y, rtol=1e-4, atol=1e-5)
        if problem:
            return [Problem(problem + _y_hint(y, y_full.detach(), partial, b2.detach(), members, forward), at=(k, 0))]
        calls = read_calls(seen["calls"])
        backward = calls[len(forward):]
        expected = [("dL/dX", x.grad, "f must wrap X so that its backward sums every member's dL/dX"),
                    ("dL/dW1 (your row shard)", w1.grad[cols], "W1 is split by output rows"),
                    ("dL/db1 (your shard)", b1.grad[cols], "b1 is split like W1's rows"),
                    ("dL/dW2 (your column shard)", w2.grad[:, cols], "W2 is split by input columns"),
                    ("dL/db2", b2.grad, "add b2 after g, once")]
        for q, ((what, want, hint), got) in enumerate(zip(expected, seen["grads"].items(len(expected)), strict=True)):
            got = got.tensor()
            problem = differ(f"{what} {at}", want, got, rtol=1e-4, atol=1e-5)
            if problem:
                if q == 0 and len(members) > 1 and differ("", alone.grad, got, rtol=1e-4, atol=1e-5) is None:
                    hint = "It is only this rank's own share: " + hint
                elif q == 0 and stray_group(backward, members):
                    hint = "It is summed over other ranks: " + stray_group(backward, members)
                else:
                    hint = "Hint: " + hint
                return [Problem(f"{problem}. {hint}", at=(k, 1, q))]
        reduces = [ranks for op, ranks in calls if op == "all_reduce"]
        if (len(forward), len(calls), len(reduces)) != (1, 2, 2):
            return [Problem(f"{at}: {len(forward)} collective(s) in forward and {len(calls)} in all "
                            f"({len(reduces)} all-reduces); a Megatron MLP makes exactly one in forward (g) and one "
                            "in backward (f)", at=(k, 2))]
        if stray_group(calls, members):
            return [Problem(f"{at}: right values, but {stray_group(calls, members)}", at=(k, 2))]
    return []
