"""Exercise 02, DDP's gradient buckets (梯度分桶) on 2 ranks: `register_bucket_hooks(params, cap_bytes)` packs the
gradients, as backward produces them, into buckets of at most 700 bytes (parallel.buckets.plan_buckets) and
all-reduces each full bucket at once, asynchronously, so communication overlaps the rest of backward.

Graded over two backwards (the hooks must reset): every gradient is the average over ranks; one all-reduce per
bucket, carrying every gradient byte once; every all-reduce has async_op=True, and the first left before the
last gradient was produced.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import register
from partrain_edu.parallel.buckets import plan_buckets

DDP_CAP_BYTES, DDP_BACKWARDS = 700, 2  # twice: the hooks must reset between backwards


def toy_model() -> nn.Module:
    """The same weights on every rank, as DDP's initial broadcast would make them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 4))


def ddp_batch(backward: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10 * backward + rank)
    return torch.randn(5, 8, generator=gen), torch.randn(5, 4, generator=gen)


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


def observe(ctx, register_bucket_hooks, *, seed: int) -> list[dict]:
    model = toy_model()
    params = list(model.parameters())
    calls = _AllReduceCalls(params)
    register_bucket_hooks(params, DDP_CAP_BYTES)
    backwards = []
    for it in range(DDP_BACKWARDS):
        x, y = ddp_batch(it, ctx.rank)
        for p in params:
            p.grad = None
        calls.reset()
        with CommTracer() as tracer, calls:
            F.mse_loss(model(x), y).backward()
        backwards.append({"grads": [tensor(p.grad) for p in params], **traffic(tracer),
                          "async": calls.asynchronous, "launched_at": calls.launched_at})
    return backwards


@register("ddp_buckets", nproc=2, observe=observe,
          summary="after each backward every gradient is the average over ranks, "
          "with one all-reduce per bucket (not per parameter) carrying every gradient byte once; the buckets "
          "leave with async_op=True, the first before backward has produced the last gradient",
          deadlock_hint="Likely: the ranks launch their buckets' all-reduces in different orders or numbers — "
          "every rank must all-reduce the same buckets in the same order.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    reference = toy_model()
    params = list(reference.parameters())
    buckets = len(plan_buckets(params, DDP_CAP_BYTES))
    total = sum(p.numel() * p.element_size() for p in params)
    for it, seen in enumerate(observed.items(DDP_BACKWARDS)):
        with torch.enable_grad():  # the learner's kernel may have turned autograd off
            local = [torch.autograd.grad(F.mse_loss(reference(x), y), params)
                     for x, y in (ddp_batch(it, r) for r in range(n))]
        for i, got in enumerate(g.tensor() for g in seen["grads"].items(len(params))):
            expected = torch.stack([grads[i] for grads in local]).mean(0)  # the gradient of the mean loss
            problem = differ(f"backward {it + 1}, gradient of parameter {i}", expected, got)
            if problem:
                r = ratio_of(expected, got)
                if r is not None and abs(r - n) < 1e-3:
                    problem += f". Missing average: divide the summed bucket by the world size {n}."
                elif isinstance(got, torch.Tensor) and differ("", local[me][i], got) is None:
                    problem += (". That is this rank's local gradient: the bucket was never all-reduced, or the "
                                "reduced values were not copied back into .grad.")
                return [problem]
        calls = seen["ops"].counts().get("all_reduce", 0)
        if calls != buckets:
            return [f"backward {it + 1}: {calls} all-reduce call(s); with a {DDP_CAP_BYTES}-byte cap the "
                    f"{len(params)} parameters make {buckets} buckets, one all-reduce each"
                    + (" — one per parameter is what buckets avoid" if calls == len(params) else "")]
        payload = seen["bytes"].counts().get("all_reduce", 0)
        if payload != total:
            return [f"backward {it + 1}: the all-reduces carried {payload} bytes; every gradient byte once is {total}"]
        launched, asynchronous = seen["launched_at"].numbers(), seen["async"].flags()
        if len(launched) != len(params) or launched[-1] < 1:
            return [f"backward {it + 1}: no bucket's all-reduce had left when the last gradient was produced — "
                    "launch each bucket from its hook as soon as it is full, so it travels while backward goes on"]
        if not all(asynchronous):
            return [f"backward {it + 1}: {asynchronous.count(False)} of {len(asynchronous)} all-reduce(s) blocked "
                    "inside the hook, stalling backward: pass async_op=True and wait on the handles once "
                    "backward ends (torch.autograd.Variable._execution_engine.queue_callback)"]
    return []
