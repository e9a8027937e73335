"""Check `ddp_buckets` (ddp_buckets.py), what its ranks log during a backward, in order: each gradient as autograd
produces it, each dist.all_reduce the learner's hooks make (bytes, async_op, group), and each wait on the work it
returned. An all-reduce over another group than the graded one is logged, then run over the graded group: a rank
outside the sub-group would never answer it, and a hang says less than the message that names the call.
"""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch
import torch.distributed as dist
import torch.nn as nn

from partrain_edu.grading.observations import group_bits

MOST_EVENTS = 300   # a runaway answer's log stays readable


def _note(events: list, kind: str, a: int, b: int = 0, c: int = 0) -> None:
    if len(events) < MOST_EVENTS:
        events.append([kind, a, b, c])


class _Watched:
    """The work an all-reduce returned: notes when the learner waits on it; anything else goes to the work."""

    def __init__(self, work, events: list, call: int):
        self._work = work
        self._events = events
        self._call = call

    def wait(self, *args, **kwargs):
        _note(self._events, "wait", self._call)
        return self._work.wait(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._work, name)


class BackwardLog:
    """One backward's events, in order: ["grad", k, 0, 0] when autograd produces parameter k's gradient (a tensor
    hook, registered before the learner's, runs before accumulation and so before their post-accumulate hooks);
    ["launch", bytes, async_op, group bits] for each dist.all_reduce; ["wait", call, 0, 0] on its work."""

    def __init__(self, params: list[nn.Parameter], group):
        self.group = group
        self.bits = group_bits(group)
        self.events = []
        for k, p in enumerate(params):
            p.register_hook(functools.partial(self._produced, k))

    def _produced(self, k: int, grad) -> None:
        _note(self.events, "grad", k)

    @contextlib.contextmanager
    def backward(self):
        self.events, traced = [], dist.all_reduce
        signature = inspect.signature(traced)

        def all_reduce(*args, **kwargs):
            call = signature.bind(*args, **kwargs)
            used, t = group_bits(call.arguments.get("group")), call.arguments.get("tensor")
            if used != self.bits:   # run over the graded group: a rank outside it would never answer
                call.arguments["group"] = self.group
            events, n = self.events, sum(e[0] == "launch" for e in self.events)
            _note(events, "launch", t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0,
                  int(bool(call.arguments.get("async_op"))), used)
            work = traced(*call.args, **call.kwargs)
            return None if work is None else _Watched(work, events, n)
        dist.all_reduce = all_reduce
        try:
            yield self
        finally:
            dist.all_reduce = traced
