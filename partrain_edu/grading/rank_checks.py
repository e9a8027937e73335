"""Checks that run the learner's functions on N ranks (Gloo on CPU): ring all-reduce, DDP buckets, ZeRO-1,
tensor-parallel f/g and the column→row parallel MLP.

Each body runs on every rank as `body(ctx, *learner_functions) -> list[str]` (this rank's problems). Besides
values, each grades the traffic the lesson is about, measured with `CommTracer` and compared with the ring
cost model (`theory.traffic` / `parallel.ring`). `main()` is what each rank executes (see core._run_on_ranks).
"""
from __future__ import annotations

import json
import math
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.core import register
from partrain_edu.parallel.buckets import plan_buckets
from partrain_edu.parallel.ring import chunk_bounds, ring_bytes_sent_by

COLLECTIVES = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "reduce_scatter_single",
               "all_gather_single"}


def _sent(tracer: CommTracer) -> int:
    return sum(r.sent for r in tracer.records)


def _ops(tracer: CommTracer) -> dict[str, int]:
    calls: dict[str, int] = {}
    for r in tracer.records:
        calls[r.op] = calls.get(r.op, 0) + 1
    return calls


# --- 1. ring all-reduce from send/recv ----------------------------------------------------------------------

@register("ring_all_reduce", nproc=3, summary="sums equal dist.all_reduce for lengths 12, 7 and 2 on 3 ranks, "
          "and each rank sent exactly the ring's 2(n−1)/n·S bytes using only point-to-point messages",
          deadlock_hint="Likely: every rank posts a blocking recv (or send) first, so all wait for a message "
          "nobody sends — post the receive with irecv and the send with isend, then wait on both; or two "
          "neighbours disagree on a chunk's size (use the same chunk boundaries on every rank).")
def ring_all_reduce_check(ctx, ring_all_reduce) -> list[str]:
    n, me = ctx.world_size, ctx.rank
    for numel in (12, 7, 2):  # divisible, not divisible (uneven chunks), fewer elements than ranks
        gen = torch.Generator().manual_seed(100 * numel + me)
        mine = torch.randn(numel, generator=gen)
        expected = mine.clone()
        dist.all_reduce(expected)
        tensor = mine.clone()
        with CommTracer() as tracer:
            out = ring_all_reduce(tensor)
        got = out if out is not None else tensor
        problem = differ(f"length {numel} on {n} ranks", expected, got)
        if problem:
            return [problem + ". Hint: rank r sends chunk (r − s − 1) mod n and adds the one it receives in "
                    "reduce-scatter step s, then forwards chunk (r − s) mod n in all-gather step s; chunk "
                    "boundaries must match on every rank (first numel % n chunks one longer)."]
        used = sorted(set(_ops(tracer)) & COLLECTIVES)
        if used:
            return [f"length {numel}: you called {used}; build the all-reduce from isend/irecv (send/recv) only"]
        want, sent = ring_bytes_sent_by(me, numel, mine.element_size(), n), _sent(tracer)
        if sent != want:
            return [f"length {numel}: sent {sent} bytes, the ring sends exactly {want} (2(n−1)/n·S with S = "
                    f"{numel * 4} B: every chunk but one per phase). "
                    + ("More means whole tensors or extra chunks travel." if sent > want else
                       "Less means some chunk never travelled.")]
    return []


# --- 2. DDP: the bucketed gradient hook ---------------------------------------------------------------------

def _toy_model() -> nn.Module:
    torch.manual_seed(0)  # the same weights on every rank, as DDP's initial broadcast would make them
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


@register("ddp_buckets", nproc=2, summary="after each backward every gradient is the average over ranks, "
          "with one all-reduce per bucket (not per parameter) carrying every gradient byte once",
          deadlock_hint="Likely: the ranks launch their buckets' all-reduces in different orders or numbers — "
          "every rank must all-reduce the same buckets in the same order.")
def ddp_buckets_check(ctx, register_bucket_hooks) -> list[str]:
    n, me, cap = ctx.world_size, ctx.rank, 700
    model, reference = _toy_model(), _toy_model()
    params = list(model.parameters())
    expected_buckets = plan_buckets(params, cap)
    register_bucket_hooks(params, cap)
    for it in range(2):  # twice: the hooks must reset between backwards
        gen = torch.Generator().manual_seed(10 * it + me)
        x, y = torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)
        for p in (*params, *reference.parameters()):
            p.grad = None
        F.mse_loss(reference(x), y).backward()
        for p in reference.parameters():
            dist.all_reduce(p.grad)
            p.grad /= n
        local = torch.autograd.grad(F.mse_loss(reference(x), y), list(reference.parameters()))  # unreduced
        with CommTracer() as tracer:
            F.mse_loss(model(x), y).backward()
        for i, (p, q) in enumerate(zip(params, reference.parameters())):
            problem = differ(f"backward {it + 1}, gradient of parameter {i}", q.grad, p.grad)
            if problem:
                r = ratio_of(q.grad, p.grad)
                if r is not None and abs(r - n) < 1e-3:
                    problem += f". Missing average: divide the summed bucket by the world size {n}."
                elif p.grad is not None and differ("", local[i], p.grad) is None:
                    problem += (". That is this rank's local gradient: the bucket was never all-reduced, or the "
                                "reduced values were not copied back into .grad.")
                return [problem]
        calls = _ops(tracer).get("all_reduce", 0)
        if calls != len(expected_buckets):
            return [f"backward {it + 1}: {calls} all-reduce call(s); with a {cap}-byte cap the {len(params)} "
                    f"parameters make {len(expected_buckets)} buckets, one all-reduce each"
                    + (" — one per parameter is what buckets avoid" if calls == len(params) else "")]
        payload = sum(r.bytes for r in tracer.records if r.op == "all_reduce")
        total = sum(p.numel() * p.element_size() for p in params)
        if payload != total:
            return [f"backward {it + 1}: the all-reduces carried {payload} bytes; every gradient byte once is {total}"]
    return []


# --- 3. ZeRO-1: the sharded optimizer step ------------------------------------------------------------------

@register("zero1_step", nproc=2, summary="3 steps equal unsharded SGD-momentum on the averaged gradient, each "
          "rank holds and updates only its 1/n of the optimizer state, and a step sends 2(n−1)/n·S bytes "
          "(what plain data parallelism sends)",
          deadlock_hint="Likely: one rank skips a collective (e.g. only the owner all-gathers) — reduce-scatter "
          "and all-gather are called by every rank.")
def zero1_check(ctx, zero1_step) -> list[str]:
    n, me, numel, lr, beta = ctx.world_size, ctx.rank, 12, 0.1, 0.9
    bounds = chunk_bounds(numel, n)
    param = torch.linspace(-1, 1, numel)
    expected_param = param.clone()
    expected_m = [torch.zeros(e - s) for s, e in bounds]  # every rank's reference state (the oracle sees all)
    momentum = torch.zeros(numel // n)                    # this rank's shard: what ZeRO-1 saves is the rest
    for step in range(3):
        grads = [torch.randn(numel, generator=torch.Generator().manual_seed(7 * step + r)) for r in range(n)]
        avg = torch.stack(grads).mean(0)
        for r, (s, e) in enumerate(bounds):
            expected_m[r].mul_(beta).add_(avg[s:e])
            expected_param[s:e] -= lr * expected_m[r]
        with CommTracer() as tracer:
            zero1_step(param, grads[me].clone(), momentum, None, lr, beta)
        problem = differ(f"step {step + 1}, momentum shard of rank {me} (entries {bounds[me]})", expected_m[me],
                         momentum)
        if problem:
            r = ratio_of(expected_m[me], momentum)
            other = [k for k in range(n) if k != me and differ("", expected_m[k], momentum) is None]
            hint = (f" Missing average: divide the reduced gradient by {n}." if r and abs(r - n) < 1e-3 else
                    f" That is rank {other[0]}'s shard: rank r owns entries [r·P/n, (r+1)·P/n)." if other else "")
            return [problem + hint]
        problem = differ(f"step {step + 1}, parameters after the step", expected_param, param)
        if problem:
            bad = [k for k, (s, e) in enumerate(bounds) if differ("", expected_param[s:e], param[s:e])]
            return [problem + f". Wrong entries belong to rank(s) {bad}'s shard: after updating its own "
                    "shard each rank must all-gather the others' updated shards."]
        want = 2 * (n - 1) * numel * 4 // n
        sent = _sent(tracer)
        if sent != want:
            return [f"step {step + 1}: sent {sent} bytes; ZeRO-1 sends {want} = 2(n−1)/n·S (reduce-scatter the "
                    "gradients, all-gather the parameters)"
                    + (" — an all-reduce of the gradients sends twice what reduce-scatter does: each rank needs "
                       "only its shard" if sent > want else "")]
    return []


# --- 4. tensor parallelism: f and g, then the column → row parallel MLP -------------------------------------

def _fg_reference(x: torch.Tensor) -> torch.Tensor:
    out = x.clone()
    dist.all_reduce(out)
    return out


@register("tp_f_g", nproc=2, arity=4, summary="f is identity forward / all-reduce backward and g is all-reduce "
          "forward / identity backward (Megatron's conjugate pair), one all-reduce each")
def tp_f_g_check(ctx, f_forward, f_backward, g_forward, g_backward) -> list[str]:
    me = ctx.rank
    x = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(me))
    summed = _fg_reference(x)
    hints = {"f forward": ("f's forward is the identity: every rank already holds the whole X. An all-reduce "
                           "here is g's forward — f and g are swapped?", x, f_forward),
             "f backward": ("f's backward all-reduces dL/dX: every rank's column slice used all of X, so the "
                            "gradient is the sum of every rank's contribution", summed, f_backward),
             "g forward": ("g's forward all-reduces: the row-parallel partial products sum to Y", summed,
                           g_forward),
             "g backward": ("g's backward is the identity: each partial product fed Y with weight 1. An "
                            "all-reduce here is f's backward — f and g are swapped?", x, g_backward)}
    for what, (hint, expected, fn) in hints.items():
        with CommTracer() as tracer:
            got = fn(x.clone(), None)
        problem = differ(what, expected, got)
        if problem:
            return [f"{problem}. Hint: {hint}"]
        want = 0 if expected is x else 1
        if _ops(tracer).get("all_reduce", 0) != want or len(tracer.records) != want:
            return [f"{what}: made {len(tracer.records)} collective call(s) {_ops(tracer)}; expected {want}"
                    " all-reduce"]
    return []


class _F(torch.autograd.Function):  # the reference f and g handed to the learner's MLP
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _fg_reference(grad)


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _fg_reference(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


@register("tp_mlp", nproc=2, summary="the column→row parallel MLP equals the full MLP in output and in every "
          "gradient (dL/dX and each weight shard), with one all-reduce forward and one backward",
          deadlock_hint="Likely: a rank skips f or g, or calls a collective the other rank does not.")
def tp_mlp_check(ctx, parallel_mlp) -> list[str]:
    t, me, h = ctx.world_size, ctx.rank, 8
    torch.manual_seed(0)  # the same full layer on every rank; each then keeps its slice
    fc, proj = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
    x = torch.randn(2, 3, h, requires_grad=True)
    y_full = proj(F.gelu(fc(x)))
    (y_full * torch.arange(y_full.numel()).reshape(y_full.shape).sin()).sum().backward()
    cols = slice(me * 4 * h // t, (me + 1) * 4 * h // t)
    w1 = fc.weight.detach()[cols].clone().requires_grad_()       # (4h/t, h): column parallel
    b1 = fc.bias.detach()[cols].clone().requires_grad_()         # (4h/t,)
    w2 = proj.weight.detach()[:, cols].clone().requires_grad_()  # (h, 4h/t): row parallel
    b2 = proj.bias.detach().clone().requires_grad_()             # (h,): added once, after g
    xl = x.detach().clone().requires_grad_()
    with CommTracer() as tracer:
        y = parallel_mlp(xl, w1, b1, w2, b2, None, lambda v, group=None: _F.apply(v),
                         lambda v, group=None: _G.apply(v))
        forward_calls = len(tracer.records)
        if isinstance(y, torch.Tensor) and y.requires_grad:
            (y * torch.arange(y.numel()).reshape(y.shape).sin()).sum().backward()
    problem = differ("output Y", y_full.detach(), y)
    if problem:
        r = ratio_of(y_full.detach() - proj.bias.detach(), y.detach() - proj.bias.detach()) \
            if isinstance(y, torch.Tensor) and y.shape == y_full.shape else None
        return [problem + (". Hint: Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2 — the bias b2 is added once, after g"
                           if r is None else f". Off by {r:.3g}×: is a sum missing or doubled?")]
    checks = [("dL/dX", x.grad, xl.grad, "f must wrap X so its backward sums every rank's dL/dX"),
              ("dL/dW1 (your column shard)", fc.weight.grad[cols], w1.grad, "W1 is split by output rows"),
              ("dL/db1", fc.bias.grad[cols], b1.grad, "b1 is split like W1's rows"),
              ("dL/dW2 (your row shard)", proj.weight.grad[:, cols], w2.grad, "W2 is split by input columns"),
              ("dL/db2", proj.bias.grad, b2.grad, "add b2 after g, once")]
    for what, expected, got, hint in checks:
        problem = differ(what, expected, got)
        if problem:
            return [f"{problem}. Hint: {hint}"]
    calls = _ops(tracer).get("all_reduce", 0)
    if (forward_calls, calls) != (1, 2):
        return [f"{forward_calls} collective(s) in forward and {calls} all-reduces in all; a Megatron MLP makes "
                "exactly one in forward (g) and one in backward (f)"]
    return []


# --- what each rank runs ------------------------------------------------------------------------------------

def main() -> None:
    from partrain_edu import runtime
    from partrain_edu.grading.core import CHECKS

    job = json.loads(open(sys.argv[1]).read())
    ctx = runtime.init()
    namespace = {"torch": torch, "dist": dist, "nn": nn, "F": F, "math": math, "chunk_bounds": chunk_bounds}
    functions = []
    for source, name in zip(job["sources"], job["names"]):
        exec(compile(source, f"<your {name}>", "exec"), namespace)
        functions.append(namespace[name])
    problems = CHECKS[job["check"]].fn(ctx, *functions)
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, problems)
    runtime.publish("grading", {rank: p for rank, p in enumerate(everyone)})
    runtime.shutdown()
