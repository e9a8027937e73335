"""Check `sharded_optimizer`, the observe half: on each of the 3 ranks, for each drawn configuration (setups.py) whose
group it belongs to, the learner's `make_sharded_optimizer` runs 3 steps; after each, what the trusted half grades.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.checks.sharded_optimizer.setups import STEPS, options_of, setups, state_bytes
from partrain_edu.grading.observations import group_bits, tensor, traffic

GUARDED = ("broadcast", "all_gather", "all_gather_into_tensor", "all_reduce", "reduce_scatter",
           "reduce_scatter_tensor", "reduce", "scatter", "gather", "all_to_all", "all_to_all_single", "barrier",
           "all_gather_object", "broadcast_object_list")


class GroupGuard:
    """While active, a collective of torch.distributed called over another group than the graded one is noted
    ([name, group bits]) and run over the graded group instead: a rank outside the sub-group would never answer it,
    and a hang says less than a message naming the call. A root (src, dst) outside the group is noted too ([name,
    root]) and read as the group rank it likely meant, which torch would refuse or hang on."""

    def __init__(self, group):
        self.group = group
        self.bits = group_bits(group)
        self.wrong = []
        self.roots = []
        self.saved = []
        self.members = [r for r in range(dist.get_world_size()) if self.bits >> r & 1]

    def __enter__(self):
        for name in GUARDED:
            original = getattr(dist, name, None)
            if original is not None and "group" in inspect.signature(original).parameters:
                self.saved.append((name, original))
                setattr(dist, name, self._guarded(name, original))
        return self

    def _guarded(self, name, original):
        signature = inspect.signature(original)

        def guarded(*args, **kwargs):
            call = signature.bind(*args, **kwargs)
            used = group_bits(call.arguments.get("group"))
            if used != self.bits:
                self.wrong += [[name, used]] * (len(self.wrong) < 8)
                call.arguments["group"] = self.group
            for key in ("src", "dst"):
                root = call.arguments.get(key)
                if isinstance(root, int) and root not in self.members and 0 <= root < len(self.members):
                    self.roots += [[f"{name}(..., {key}={root})", root]] * (len(self.roots) < 8)
                    call.arguments[key] = self.members[root]
            return original(*call.args, **call.kwargs)
        return guarded

    def __exit__(self, *exc):
        for name, original in reversed(self.saved):
            setattr(dist, name, original)
        self.saved = []


def observe(ctx, make_sharded_optimizer, *, seed: int) -> list:
    sub = dist.new_group([1, 2])   # every rank creates it, members or not
    runs = []
    for s in setups(seed):
        if ctx.rank not in s.ranks:
            runs.append(None)
            continue
        group = None if len(s.ranks) == ctx.world_size else sub
        model = s.model()
        params = list(model.parameters())
        trainable = [p for p in params if p.requires_grad]
        index = {id(p): k for k, p in enumerate(params)}
        guard = GroupGuard(group)
        with guard:
            opt = make_sharded_optimizer(s.params_arg(model), s.cls, group, **dict(s.defaults))
        built, steps = guard.wrong, []
        for step in range(STEPS):
            opt.zero_grad()
            left = [k for k, p in enumerate(params) if p.grad is not None and bool(p.grad.ne(0).any())]
            # data parallelism's average, computed here from every member's batch (the very sums the trusted half
            # makes, so no rounding of an all-reduce's order stands between them); outside the traced window
            with torch.enable_grad():
                local = [torch.autograd.grad(F.mse_loss(model(x), y), trainable)
                         for x, y in (s.batch(step, r) for r in s.ranks)]
            for p in params:
                p.grad = None
            for k, p in enumerate(trainable):
                p.grad = torch.stack([g[k] for g in local]).sum(0) / len(s.ranks)
            guard = GroupGuard(group)
            with CommTracer() as tracer, guard:
                opt.step()
            per, foreign = state_bytes(getattr(opt, "optim", None), index)
            steps.append({"left": left, "params": [tensor(p) for p in params], "buffer": tensor(model.shift),
                          "state": per, "foreign": foreign, "wrong_group": guard.wrong, "roots": guard.roots,
                          **traffic(tracer),
                          "received": sum(r.received for r in tracer.records)})
        inner = getattr(opt, "optim", None)
        options = options_of(inner, index, s.keys)
        owned = [None] * len(s.ranks)   # who steps what, gathered untraced for the partition check: group order
        dist.all_gather_object(owned, [k for k, o in enumerate(options) if o is not None], group=group)
        strangers = sum(id(p) not in index for g in getattr(inner, "param_groups", []) for p in g.get("params", []))
        runs.append({"optim": None if inner is None else type(inner).__name__[:60], "built_wrong": built,
                     "strangers": strangers,
                     "is_class": type(inner) is s.cls, "owned": owned, "options": options, "steps": steps})
    return runs
