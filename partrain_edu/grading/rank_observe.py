"""The half of each multi-rank check that runs on the ranks, beside the learner's code: call the learner's
functions on the fixed inputs of rank_inputs.py and write down what came out — output values, gradients, the
collectives called and the bytes sent (CommTracer) — as plain JSON data. No verdict is made here.

`main()` is what each rank executes (started by rank_launch.py): rank 0 gathers every rank's observations and
publishes them as one JSON *text*. The learner's code shares these processes, so it can publish anything
instead; the trusted caller (rank_verify.py) therefore treats the text as untrusted data and recomputes every
expected value itself. The traffic (op counts, bytes) is self-reported: a body could patch CommTracer, but it
must still produce the right values to pass.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading import rank_inputs as inputs
from partrain_edu.parallel.ring import chunk_bounds

MAX_VALUES = 4096  # the checks' tensors hold at most 256 values; a bigger one is reported by its shape alone


def tensor(value: Any) -> dict:
    """{"shape", "values"} for a tensor (values as floats), {"shape"} for a huge one, {"type"} for anything else."""
    if not isinstance(value, torch.Tensor):
        return {"type": type(value).__name__}
    if value.is_complex():
        return {"type": f"a complex tensor ({value.dtype})"}
    shape = list(value.shape)
    if value.numel() > MAX_VALUES:
        return {"shape": shape}
    return {"shape": shape, "values": value.detach().to("cpu", torch.float64).reshape(-1).tolist()}


def traffic(tracer: CommTracer) -> dict:
    """{"ops": {op: calls}, "sent": bytes sent under the ring model, "bytes": {op: payload bytes},
    "peers": {op: [global ranks it talked to (p2p) or rooted at, sorted]}}."""
    ops: dict[str, int] = {}
    payload: dict[str, int] = {}
    peers: dict[str, set] = {}
    for r in tracer.records:
        ops[r.op] = ops.get(r.op, 0) + 1
        payload[r.op] = payload.get(r.op, 0) + r.bytes
        if r.peer is not None:
            peers.setdefault(r.op, set()).add(r.peer)
    return {"ops": ops, "sent": sum(r.sent for r in tracer.records), "bytes": payload,
            "peers": {op: sorted(ranks) for op, ranks in peers.items()}}


def ring_all_reduce(ctx, ring_all_reduce) -> list[dict]:
    runs = []
    for numel in inputs.RING_LENGTHS:
        tensor_in = inputs.ring_input(numel, ctx.rank)
        with CommTracer() as tracer:
            out = ring_all_reduce(tensor_in)
        runs.append({"out": tensor(out if out is not None else tensor_in), **traffic(tracer)})
    return runs


class _AllReduceCalls:
    """Inside a CommTracer window, wraps dist.all_reduce to note each call's async_op; `launched_at` holds how
    many calls had been made when each gradient was produced. Its tensor hooks are registered before the
    learner's hooks, so on each parameter they run first (tensor hooks in order, then post-accumulate hooks)."""

    def __init__(self, params: list[nn.Parameter]):
        for p in params:
            p.register_hook(self._produced)

    def reset(self) -> None:
        self.asynchronous: list[bool] = []
        self.launched_at: list[int] = []

    def _produced(self, grad):
        self.launched_at.append(len(self.asynchronous))

    def __enter__(self):
        self.traced = dist.all_reduce

        def all_reduce(*args, **kwargs):
            self.asynchronous.append(bool(kwargs.get("async_op", args[3] if len(args) > 3 else False)))
            return self.traced(*args, **kwargs)
        dist.all_reduce = all_reduce
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self.traced


def ddp_buckets(ctx, register_bucket_hooks) -> list[dict]:
    model = inputs.toy_model()
    params = list(model.parameters())
    calls = _AllReduceCalls(params)
    register_bucket_hooks(params, inputs.DDP_CAP_BYTES)
    backwards = []
    for it in range(inputs.DDP_BACKWARDS):
        x, y = inputs.ddp_batch(it, ctx.rank)
        for p in params:
            p.grad = None
        calls.reset()
        with CommTracer() as tracer, calls:
            F.mse_loss(model(x), y).backward()
        backwards.append({"grads": [tensor(p.grad) for p in params], **traffic(tracer),
                          "async": calls.asynchronous, "launched_at": calls.launched_at})
    return backwards


def zero1_step(ctx, zero1_step) -> list[dict]:
    param = inputs.zero1_start()
    momentum = torch.zeros(inputs.ZERO1_NUMEL // ctx.world_size)  # this rank's shard: what ZeRO-1 keeps
    steps = []
    for step in range(inputs.ZERO1_STEPS):
        with CommTracer() as tracer:
            zero1_step(param, inputs.zero1_grad(step, ctx.rank), momentum, None, inputs.ZERO1_LR, inputs.ZERO1_BETA)
        steps.append({"momentum": tensor(momentum), "param": tensor(param), **traffic(tracer)})
    return steps


def tp_f_g(ctx, *functions: Callable) -> list[dict]:
    x = inputs.fg_input(ctx.rank)
    calls = []
    for fn in functions:  # in the order of inputs.FG_NAMES
        with CommTracer() as tracer:
            out = fn(x.clone(), None)
        calls.append({"out": tensor(out), "calls": len(tracer.records), **traffic(tracer)})
    return calls


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


def tp_mlp(ctx, parallel_mlp) -> dict:
    fc, proj, x = inputs.mlp_layers()
    cols = inputs.mlp_columns(ctx.rank, ctx.world_size)
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
            (y * inputs.loss_weights(y)).sum().backward()
    return {"y": tensor(y), "forward_calls": forward_calls, **traffic(tracer),
            "grads": [tensor(t.grad) for t in (x, w1, b1, w2, b2)]}


OBSERVE: dict[str, Callable] = {"ring_all_reduce": ring_all_reduce, "ddp_buckets": ddp_buckets,
                                "zero1_step": zero1_step, "tp_f_g": tp_f_g, "tp_mlp": tp_mlp}
GIVEN: dict[str, dict[str, Any]] = {"ring_all_reduce": {"chunk_bounds": chunk_bounds}}
BASE = {"torch": torch, "dist": dist, "nn": nn, "F": F, "math": math}  # what every learner function may use


def observer(name: str, **given: Any) -> Callable:
    """Register `fn(ctx, *learner_functions) -> observations` as check `name`'s observe half; `given` are the
    helpers (givens/) the learner's functions may call on the ranks, besides BASE."""
    def wrap(fn: Callable) -> Callable:
        OBSERVE[name], GIVEN[name] = fn, given
        return fn
    return wrap


def namespace_for(check: str) -> dict[str, Any]:
    """The globals a learner's function of check `check` runs with on the ranks."""
    from partrain_edu.grading import checks

    checks.load_all()
    return {**BASE, **GIVEN.get(check, {})}


def main() -> None:
    """On each rank: JOB = {"check", "sources", "names"}; rank 0 publishes "observations", a JSON text of the
    list of every rank's observations."""
    from partrain_edu import runtime

    with open(sys.argv[1]) as f:
        job = json.load(f)
    ctx = runtime.init()
    namespace = namespace_for(job["check"])
    functions = []
    for source, name in zip(job["sources"], job["names"]):
        exec(compile(source, f"<your {name}>", "exec"), namespace)
        functions.append(namespace[name])
    mine = OBSERVE[job["check"]](ctx, *functions)
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine)
    runtime.publish("observations", json.dumps(everyone))  # text, not objects: the caller only json-decodes it
    runtime.shutdown()
