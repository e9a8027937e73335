"""Exercise 02, DDP's gradient buckets (梯度分桶): `register_bucket_hooks(params, cap_bytes, group)` packs the
gradients, in the order backward produces them (reverse registration order), into buckets closed once they hold
cap_bytes or more (parallel.buckets.plan_buckets, the rule of notebooks/02_data_parallel.ipynb), and all-reduces
each bucket asynchronously the moment it is full, waiting on the works only once backward has ended.

Each run draws three configurations from its seed (trials.py), on 3 ranks: a model of 3–5 Linear layers of random
widths (some without bias), a cap, and the group — twice the default group of 3, once the sub-group [1, 2]. Two caps
equal the bytes of the first few gradients exactly, so closing a bucket only *above* the cap changes it. Each runs
two backwards (the hooks must reset; every .grad is set to None before each). Graded against the plan recomputed
here, from what the ranks log during backward (ddp_buckets_log.py: each gradient as autograd produces it, each
all-reduce's bytes, async_op and group, each wait on its work):
1. order and overlap: bucket k's all-reduce leaves right after the gradient that fills it, before the next one is
   produced, carrying exactly its bytes over the group with async_op=True, and no work is waited on before backward
   has produced its last gradient — so every bucket but the last travels while backward goes on;
2. values: every gradient is the average over the group's ranks; the parameters are left alone.
A hint names a likely cause (late, one bucket, one per parameter, `>` for `>=`, forward order) only when the
all-reduce sizes are exactly what that mistake, and no other of them, gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.checks.ddp_buckets_log import MOST_EVENTS, BackwardLog
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.observations import Malformed, Reader, tensor, traffic
from partrain_edu.grading.registry import Problem, register
from partrain_edu.grading.trials import stream
from partrain_edu.parallel.buckets import plan_buckets

NPROC, BACKWARDS = 3, 2
GROUPS = ((0, 1, 2), (0, 1, 2), (1, 2))   # the graded group of each configuration: global ranks
END = 10**6                               # a Problem's `at` after every event of its backward


@dataclass(frozen=True)
class Setup:
    widths: tuple[int, ...]   # d_0 … d_L of the L Linear layers
    biases: tuple[bool, ...]
    cap: int                  # bytes
    ranks: tuple[int, ...]    # the group
    seed: int                 # weights and batches

    def model(self) -> nn.Sequential:
        """The same weights on every rank (as DDP's initial broadcast makes them) and here."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            layers = [m for k, bias in enumerate(self.biases)
                      for m in (nn.Linear(self.widths[k], self.widths[k + 1], bias=bias), nn.Tanh())]
            return nn.Sequential(*layers[:-1])

    def batch(self, backward: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed + 7919 * backward + 104729 * rank)
        return torch.randn(4, self.widths[0], generator=gen), torch.randn(4, self.widths[-1], generator=gen)

    def where(self, c: int, b: int) -> str:
        group = f"the default group of {NPROC} ranks" if len(self.ranks) == NPROC else f"group {list(self.ranks)}"
        return f"configuration {c + 1} ({group}, cap {self.cap} B), backward {b + 1}"

    def order(self) -> list[int]:
        """The parameters in the order autograd produces their gradients, seen here (the ranks' log must agree)."""
        model, order = self.model(), []
        for k, p in enumerate(model.parameters()):
            p.register_hook(lambda grad, k=k: order.append(k))
        with torch.enable_grad():
            F.mse_loss(model(self.batch(0, 0)[0]), self.batch(0, 0)[1]).backward()
        return order


def setups(seed: int) -> list[Setup]:
    """The run's configurations. A tie cap is the bytes of the first j gradients backward produces (2 ≤ j ≤ P − 2):
    `>=` closes bucket 0 there, `>` takes one more, and neither makes one bucket of all; the other cap is anything
    that leaves at least two buckets."""
    rnd, out = stream(seed, "ddp_buckets"), []
    for c, ranks in enumerate(GROUPS):
        sizes: list[int] = []
        while len(sizes) < 4:   # P ≥ 4 parameters
            layers = rnd.randint(3, 5)
            widths = tuple(rnd.randint(2, 12) for _ in range(layers + 1))
            biases = tuple(rnd.random() < 0.75 for _ in range(layers))
            sizes = _backward_sizes(widths, biases)
        cap = sum(sizes[:rnd.randint(2, len(sizes) - 2)]) if c != 1 else \
            rnd.randint(2 * min(sizes), sum(sizes) - sizes[-1])
        out.append(Setup(widths, biases, cap, ranks, rnd.randrange(2**31)))
    return out


def _backward_sizes(widths, biases) -> list[int]:
    """Gradient bytes in the order backward produces them: the last layer's bias, its weight, … the first weight."""
    return [b for k in reversed(range(len(biases)))
            for b in [4 * widths[k + 1]] * biases[k] + [4 * widths[k] * widths[k + 1]]]


def observe(ctx, register_bucket_hooks, *, seed: int) -> list:
    sub = dist.new_group([1, 2])   # every rank creates it, members or not
    out = []
    for s in setups(seed):
        if ctx.rank not in s.ranks:
            out.append(None)
            continue
        group = None if len(s.ranks) == ctx.world_size else sub
        model = s.model()
        params = list(model.parameters())
        log = BackwardLog(params, group)
        register_bucket_hooks(params, s.cap, group)
        backwards = []
        for b in range(BACKWARDS):
            x, y = s.batch(b, ctx.rank)
            for p in params:
                p.grad = None
            with CommTracer() as tracer, log.backward():
                F.mse_loss(model(x), y).backward()
            backwards.append({"events": log.events, "grads": [tensor(p.grad) for p in params],
                              "params": [tensor(p) for p in params], "ops": traffic(tracer)["ops"]})
        out.append(backwards)
    return out


@register("ddp_buckets", nproc=NPROC, observe=observe,
          summary="on drawn models, caps and groups (the default group of 3 ranks and the sub-group [1, 2]), two "
          "backwards each: every gradient is the average over the group; each bucket (reverse order, closed once it "
          "holds cap_bytes or more) leaves by one all-reduce with async_op=True the moment it is full, carrying "
          "exactly its bytes, and no work is waited on before backward has produced its last gradient",
          deadlock_hint="Likely: the ranks launch their buckets' all-reduces in different orders or numbers — "
          "every rank must all-reduce the same buckets in the same order.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for c, (s, seen) in enumerate(zip(setups(seed), observed.items(len(GROUPS)), strict=True)):
        problem = _verify_setup(c, s, me, seen) if me in s.ranks else None
        if problem:
            return [problem]
    return []


def _verify_setup(c: int, s: Setup, me: int, seen: Reader) -> Problem | None:
    model = s.model()
    params, order = list(model.parameters()), s.order()
    sizes = [p.numel() * p.element_size() for p in params]
    index = {id(p): k for k, p in enumerate(params)}   # by identity: tensors compare by value
    plan = [[index[id(p)] for p in bucket.params] for bucket in plan_buckets(params, s.cap)]
    initial = [p.detach().clone() for p in params]
    for b, backward in enumerate(seen.items(BACKWARDS)):
        with torch.enable_grad():  # the learner's kernel may have turned autograd off
            local = {r: torch.autograd.grad(F.mse_loss(model(x), y), params) for r in s.ranks
                     for x, y in [s.batch(b, r)]}
        events = backward["events"].records(("name", "count", "count", "count"), MOST_EVENTS, "events")
        problem = _events_problem(s.where(c, b), (c, b), s, events, plan, order, sizes)
        if problem:
            return problem
        calls = sorted(set(backward["ops"].counts()) - {"all_reduce"})
        if calls:
            return Problem(f"{s.where(c, b)}: your hooks called {calls}: a bucket travels by one dist.all_reduce",
                           at=(c, b, END))
        for k, got in enumerate(p.tensor() for p in backward["params"].items(len(params))):
            problem = differ(f"{s.where(c, b)}: params[{k}] after backward", initial[k], got)
            if problem:   # a step fused into the hooks: the gradients may be right, the model has moved
                return Problem(problem + ". Your hooks changed a parameter: they own .grad only (the optimizer "
                               "steps the parameters later)", at=(c, b, END))
        for k, got in enumerate(g.tensor() for g in backward["grads"].items(len(params))):
            expected = torch.stack([local[r][k] for r in s.ranks]).mean(0)  # the gradient of the mean loss
            problem = differ(f"{s.where(c, b)}: the gradient of params[{k}]", expected, got)
            if problem:
                return Problem(problem + _value_hint(expected, got, local[me][k], len(s.ranks)), at=(c, b, END))
    return None


def _events_problem(where, at, s, events, plan, order, sizes) -> Problem | None:
    """The first event that departs from the plan: bucket k launched right after the gradient that fills it, with
    its bytes, over the group, async_op=True, and no wait before the last gradient."""
    produced = []
    launched = []
    bits = sum(1 << r for r in s.ranks)
    launches = [e[1] for e in events if e[0] == "launch"]
    for t, (kind, x, y, z) in enumerate(events):
        due = len(launched) < len(plan) and set(plan[len(launched)]) <= set(produced)   # buckets leave in order
        if kind == "grad":
            if len(produced) >= len(order) or x != order[len(produced)]:
                raise Malformed("the gradients were logged in another order than autograd produces them")
            if due:
                i = len(launched)
                return Problem(f"{where}: after backward produced params[{produced[-1]}]'s gradient, bucket {i} "
                               f"was full ({sum(sizes[k] for k in plan[i])} B of gradients, cap {s.cap} B: a bucket "
                               "closes once it holds cap_bytes or more), but no all-reduce left before the next "
                               f"gradient (params[{x}]'s)" + _cause(launches, s, sizes, plan), at=at + (t,))
            produced.append(x)
        elif kind == "launch":
            i = len(launched)
            if i >= len(plan):
                return Problem(f"{where}: all-reduce {i + 1} ({x} B), but the cap makes {len(plan)} buckets, one "
                               "all-reduce each" + _cause(launches, s, sizes, plan), at=at + (t,))
            if not due:
                return Problem(f"{where}: an all-reduce of {x} B left after {len(produced)} gradient(s), before "
                               f"bucket {i} was full (it ends with params[{plan[i][-1]}]'s gradient)"
                               + _cause(launches, s, sizes, plan), at=at + (t,))
            want = sum(sizes[k] for k in plan[i])
            if z != bits:
                used = [r for r in range(NPROC) if z >> r & 1]
                return Problem(f"{where}: all-reduce {i + 1} went over ranks {used}, but the group is {list(s.ranks)}"
                               ": pass group=group to dist.all_reduce (the check ran it over the group, so that the "
                               "run could go on)", at=at + (t,))
            if x != want:
                return Problem(f"{where}: all-reduce {i + 1} carried {x} B; bucket {i} holds {want} B of gradients "
                               f"(params {plan[i]})" + _cause(launches, s, sizes, plan), at=at + (t,))
            if not y and len(produced) < len(order):
                return Problem(f"{where}: all-reduce {i + 1} was blocking (async_op=False): it held up backward "
                               "inside the hook — pass async_op=True and wait on the works once backward has "
                               "ended (torch.autograd.Variable._execution_engine.queue_callback)", at=at + (t,))
            launched.append(i)
        elif kind == "wait":
            if len(produced) < len(order):
                right_after = t > 0 and events[t - 1][0] == "launch" and x == len(launched) - 1
                return Problem(f"{where}: your code waited on all-reduce {x + 1}'s work before backward had produced "
                               f"its last gradient ({len(produced)} of {len(order)} produced)"
                               + (", right after launching it" if right_after else "") + ": while a hook waits, "
                               "backward stops, so nothing overlaps — keep the works and wait on them in the callback "
                               "queued for the end of backward", at=at + (t,))
        else:
            raise Malformed(f"an event of kind {kind!r}")
    if len(produced) < len(order) or len(launched) < len(plan):
        return Problem(f"{where}: {len(launched)} all-reduce(s) after {len(produced)} of {len(order)} gradients; "
                       f"the cap makes {len(plan)} buckets, one all-reduce each" + _cause(launches, s, sizes, plan)
                       + ". Do the hooks reset for the next backward?" * (at[1] > 0 and not launched),
                       at=at + (len(events),))
    return None


def _buckets(sizes: list[int], cap: int, strict: bool = False) -> list[int]:
    """Bucket bytes walking `sizes` in order, closing a bucket once it holds cap bytes or more (strict: more)."""
    out, size = [], 0
    for b in sizes:
        size += b
        if size > cap or (size == cap and not strict):
            out, size = out + [size], 0
    return out + [size] * (size > 0)


def _cause(launches: list[int], s: Setup, sizes: list[int], plan: list[list[int]]) -> str:
    """A likely cause, named only when this backward's all-reduce sizes are exactly what that mistake gives, and
    what no other mistake of the list would give too."""
    order = _backward_sizes(s.widths, s.biases)
    causes = {
        "late": launches == [sum(sizes[k] for k in bucket) for bucket in plan],
        "one": launches == [sum(order)],
        "each": launches == order,
        "strict": launches == _buckets(order, s.cap, strict=True),
        "forward": sorted(launches) == sorted(_buckets(order[::-1], s.cap)),
    }
    named = [cause for cause, fits in causes.items() if fits]
    return "" if len(named) != 1 else {
        "late": ". Your buckets are right but left late: launch each one from the hook of its last gradient, as "
                "soon as it is full, so it travels while backward goes on",
        "one": ". One bucket of every gradient can only leave once backward has ended: close a bucket once it "
               "holds cap_bytes or more",
        "each": ". One all-reduce per parameter is what buckets avoid",
        "strict": f". Your buckets close only once they hold more than {s.cap} B: a bucket that holds exactly "
                  "cap_bytes is full (>=, not >)",
        "forward": ". Your buckets follow the forward (registration) order; backward produces the last layer's "
                   "gradients first, so fill them walking the parameters in reverse"}[named[0]]


def _value_hint(expected: torch.Tensor, got, local: torch.Tensor, n: int) -> str:
    r = ratio_of(expected, got)
    if r is not None and abs(r - n) < 1e-3:
        return f". Missing average: divide the summed bucket by the group's size {n}"
    wrong = [d for d in range(1, 9) if r is not None and d != n and abs(r * d - n) < 1e-3]
    if wrong:
        return (f". Divided by {wrong[0]}" + (", the default group's size" if wrong[0] == NPROC else "")
                + f": this group has {n} ranks — dist.get_world_size(group)")
    if isinstance(got, torch.Tensor) and differ("", local, got) is None:
        return (". That is this rank's local gradient: the bucket was never all-reduced, or the reduced values were "
                "not copied back into .grad")
    return ""
