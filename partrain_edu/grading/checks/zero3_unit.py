"""Exercise 08, ZeRO-3 / FSDP units (Rajbhandari et al. 2020 §5.3; Zhao et al. 2023 §3): `fsdp_step` trains a
model whose parameters no rank holds whole. Three units, Linear(16, 16) + Tanh each, then the root's head
Linear(16, 3): each is one flat tensor (weight, bias, zero padding to a multiple of n), and each of the 2 ranks
holds only its 1/n shard of every one. The root is sharded too but, as in PyTorch FSDP, not resharded after
forward (backward starts with it): gathered once a step, kept until its own gradient is reduce-scattered.

Graded, 3 SGD steps on 2 ranks, each rank on its own batch: (1) losses and every shard after each step equal one
process training the unsharded model on the union of both batches (recomputed here from seeds); (2) traffic per
step (CommTracer): all-gathers and reduce-scatters only, each unit gathered for forward and again for backward
and its gradient reduce-scattered: 3·(n−1)/n·S_units, 1.5× DDP's 2(n−1)/n·S_units, plus 2·(n−1)/n·S_root;
(3) memory: the gathered full parameters alive at once (the given `gather`'s results, followed with
weakref.finalize: a view, or a tensor autograd saved, keeps one alive) never exceed root + one unit, and none is
left alive after the step. A copy (.clone()) of gathered parameters escapes that count.
"""
from __future__ import annotations

import gc
import weakref

import torch
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.givens.zero3_unit import gather, views
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import register

D, C, UNITS, BATCH, STEPS, LR = 16, 3, 3, 4, 3, 0.2
NAMES = ("root", *(f"unit {k}" for k in range(UNITS)))   # the order of the shards in the observations
GATHERS = ("all_gather_into_tensor", "all_gather")
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter")


def model() -> nn.Sequential:
    """The unsharded model, the same on every rank: unit k seeded 80 + k, the root's head seeded 90."""
    with torch.random.fork_rng(devices=[]):
        layers = []
        for k in range(UNITS):
            torch.manual_seed(80 + k)
            layers += [nn.Linear(D, D), nn.Tanh()]
        torch.manual_seed(90)
        return nn.Sequential(*layers, nn.Linear(D, C))


def pieces(net: nn.Sequential) -> list[nn.Linear]:
    """The Linear of each flat tensor, in the order of NAMES: the root's head, then the units."""
    return [net[-1], *(net[2 * k] for k in range(UNITS))]


def padded(numel: int, n: int) -> int:
    return -(-numel // n) * n


def flat(weight: torch.Tensor, bias: torch.Tensor, n: int) -> torch.Tensor:
    """(padded,) weight then bias then zeros: the layout FSDP's FlatParameter gives a unit."""
    values = torch.cat([weight.detach().reshape(-1), bias.detach()])
    return torch.cat([values, values.new_zeros(padded(values.numel(), n) - values.numel())])


def shard(full: torch.Tensor, rank: int, n: int) -> torch.Tensor:
    size = full.numel() // n
    return full[rank * size:(rank + 1) * size].clone()


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, D, generator=gen), torch.randn(BATCH, C, generator=gen)


def nbytes(n: int) -> dict[str, int]:
    """Bytes of each name's full (padded) flat parameters in float32."""
    return {name: 4 * padded(layer.weight.numel() + layer.bias.numel(), n)
            for name, layer in zip(NAMES, pieces(model()))}


class _Gathered:
    """The full parameters `gather` returned that are still alive: weakref.finalize drops one when the tensor
    dies — when its last name, view and autograd-saved reference are gone."""

    def __init__(self):
        self.names: dict[int, str] = {}     # storage address of a shard -> its name
        self.alive: dict[int, tuple[str, int, str]] = {}    # serial -> (name, bytes, "forward"/"backward")
        self.serial, self.events = 0, []

    def opened(self, full: torch.Tensor, shard: torch.Tensor) -> None:
        name = self.names.get(shard.untyped_storage().data_ptr(), f"a copy of a shard ({shard.numel()} values)")
        in_backward = getattr(torch._C, "_current_graph_task_id", lambda: -1)() != -1   # -1: not in backward
        self.serial += 1
        self.alive[self.serial] = (name, full.numel() * full.element_size(), "backward" if in_backward else "forward")
        weakref.finalize(full, self.alive.pop, self.serial, None)   # holds no reference to `full`
        self.events.append({"of": name, "backward": in_backward, "alive": [list(a) for a in self.alive.values()]})


GATHERED = _Gathered()


def tracked_gather(shard, group=None):
    """The given `gather`, as the learner's code calls it on the ranks, followed by the check."""
    gc.collect()   # what only a reference cycle still holds is garbage: count what the code really keeps alive
    full = gather(shard, group)
    GATHERED.opened(full, shard)
    return full


def _loss(value) -> dict:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return tensor(value.detach().reshape(()))
    return tensor(torch.tensor(float(value)) if isinstance(value, (int, float)) else value)


def observe(ctx, fsdp_step, *, seed: int) -> list[dict]:
    n, me = ctx.world_size, ctx.rank
    # this rank's 1/n of each flat tensor, a leaf that requires grad: FSDP's sharded FlatParameter
    shards = [shard(flat(layer.weight, layer.bias, n), me, n).requires_grad_() for layer in pieces(model())]
    GATHERED.names = {s.untyped_storage().data_ptr(): name for s, name in zip(shards, NAMES)}
    steps = []
    for step in range(STEPS):
        x, y = batch(step, me)
        x.requires_grad_()   # as an earlier stage's output: every unit's backward needs its weight for dL/dh
        GATHERED.events = []
        with CommTracer() as tracer:
            loss = fsdp_step(shards[0], shards[1:], x, y, LR, None)
        loss = _loss(loss)   # drops the learner's loss tensor (and the graph it may hold)
        gc.collect()         # a reference cycle the collector frees is no leak
        steps.append({"loss": loss, "shards": [tensor(s) for s in shards], **traffic(tracer),
                      "calls": [[r.op, r.bytes] for r in tracer.records], "gathers": GATHERED.events,
                      "alive_after": [list(a) for a in GATHERED.alive.values()]})
    return steps


def _update_hint(want: torch.Tensor, got: torch.Tensor, alone: torch.Tensor, n: int) -> str:
    """Why a shard moved by `got` instead of `want` (after − before this step; `alone`: by this rank's gradient)."""
    if bool((got == 0).all()):
        return " The shard did not move: update it in place (under torch.no_grad()) with its gradient shard."
    r = ratio_of(want, got)
    if r is not None and abs(r - n) < 1e-2:
        return f" It moved {r:.3g}× too far: the reduce-scatter sums the ranks' gradients; divide by n = {n}."
    if r is not None and abs(r - 1 / n) < 1e-3:
        return f" It moved 1/{n} as far: the gradient was averaged twice."
    if differ("", alone, got, rtol=1e-4, atol=1e-6) is None:
        return " It moved by this rank's own gradient: reduce-scatter the unit's full gradient across ranks."
    return (" Check the order: gather, compute, free; in backward gather again, compute the unit's full padded "
            "gradient, reduce-scatter it and keep your own 1/n.")


def _values(me: int, n: int, step: int, seen: Reader, net: nn.Sequential) -> list[str]:
    """Loss and shards of one step against one process on both ranks' batches; steps `net` by SGD."""
    layers = pieces(net)
    params = [p for layer in layers for p in (layer.weight, layer.bias)]
    batches = [batch(step, r) for r in range(n)]
    with torch.enable_grad():   # the learner's kernel may have turned autograd off
        losses = [F.mse_loss(net(x), y) for x, y in batches]
        grads = torch.autograd.grad(torch.stack(losses).mean(), params, retain_graph=True)  # the union batch
        local = torch.autograd.grad(losses[me], params)
    problem = differ(f"step {step + 1}, loss on rank {me}'s batch", losses[me].detach(), seen["loss"].tensor(),
                     rtol=1e-4, atol=1e-6)
    if problem:
        return [problem + (". Hint: unit k computes h ← tanh(h·Wₖᵀ + bₖ) with W, b = views(gather(shard), "
                           "[(16, 16), (16,)]), the root ŷ = h·Wᵀ + b, loss = F.mse_loss(ŷ, y)" if step == 0 else
                           f": the update of step {step} left some parameters wrong")]
    before = [shard(flat(layer.weight, layer.bias, n), me, n) for layer in layers]
    with torch.no_grad():
        for p, g in zip(params, grads):
            p -= LR * g
    for i, (name, got) in enumerate(zip(NAMES, seen["shards"].items(len(NAMES)))):
        want, got = shard(flat(layers[i].weight, layers[i].bias, n), me, n), got.tensor()
        problem = differ(f"step {step + 1}, {name}'s shard on rank {me} after the update", want, got,
                         rtol=1e-4, atol=1e-6)
        if problem:
            if isinstance(got, torch.Tensor) and got.shape == want.shape:
                alone = -LR * shard(flat(local[2 * i], local[2 * i + 1], n), me, n)
                problem += "." + _update_hint(want - before[i], got - before[i], alone, n)
            return [problem]
    return []


def _traffic(step: int, seen: Reader, n: int, size: dict[str, int]) -> list[str]:
    """Kinds, calls and bytes sent of one step against FSDP's: each unit gathered twice, reduce-scattered once."""
    s_root, s_unit = size["root"], size["unit 0"]
    calls = seen["calls"].records(("name", "count"), what="calls")   # (op, payload bytes) of every traced call
    ring = {"all_reduce": 2, **{op: 1 for op in GATHERS + REDUCE_SCATTERS}}
    unit_sent = sum(-(-ring.get(op, 0) * (n - 1) * b // n) for op, b in calls if b == s_unit)
    ddp = 2 * (n - 1) * s_unit * UNITS // n
    tally = {(kind, who): sum(op in ops and b == s for op, b in calls)
             for kind, ops in (("gather", GATHERS), ("reduce", REDUCE_SCATTERS)) for who, s in
             (("root", s_root), ("unit", s_unit))}
    at, problems = f"step {step + 1}", []
    other = sorted({op for op, _ in calls} - set(GATHERS + REDUCE_SCATTERS))
    if other:   # the counts below would only repeat it
        return [f"{at}: you called {other}; FSDP needs only all-gathers (parameters) and reduce-scatters "
                "(gradients)" + (f": an all-reduce hands every rank the whole gradient, 2(n−1)/n·S, though it "
                f"keeps only 1/n — the units sent {unit_sent} B, {unit_sent / ddp:.3g}× DDP's {ddp} B instead of "
                "1.5×" if "all_reduce" in other else "")]
    odd = sorted({(op, b) for op, b in calls if op in GATHERS + REDUCE_SCATTERS and b not in (s_root, s_unit)})
    if odd:
        problems.append(f"{at}: {odd[0][0]} of {odd[0][1]} B, neither a unit's flat tensor ({s_unit} B) nor the "
                        f"root's ({s_root} B): gather and reduce-scatter each one whole, padding included")
    want = {("gather", "root"): 1, ("gather", "unit"): 2 * UNITS, ("reduce", "root"): 1, ("reduce", "unit"): UNITS}
    why = {("gather", "root"): "once: it stays gathered from its forward through its backward, which comes first",
           ("gather", "unit"): "twice each: before its forward and again before its backward",
           ("reduce", "root"): "once, its whole padded gradient", ("reduce", "unit"): "once each, the whole "
           "padded gradient of the unit"}
    for key, count in want.items():
        if tally[key] != count:
            verb = "all-gathered" if key[0] == "gather" else "reduce-scattered"
            problems.append(f"{at}: {'the root was' if key[1] == 'root' else 'the units were'} {verb} "
                            f"{tally[key]} time(s); expected {count} — {why[key]}")
    expected = UNITS * 3 * -(-(n - 1) * s_unit // n) + 2 * -(-(n - 1) * s_root // n)
    sent = seen["sent"].count()
    if not problems and sent != expected:
        problems.append(f"{at}: sent {sent} B; FSDP sends {expected} B = 3(n−1)/n·S_units ({unit_sent} B, 1.5× "
                        f"DDP's {ddp} B) + 2(n−1)/n·S_root")
    tracked = len(seen["gathers"].value) if isinstance(seen["gathers"].value, list) else 0
    gathers = sum(op in GATHERS for op, _ in calls)
    if gathers > tracked:
        problems.append(f"{at}: {gathers - tracked} of {gathers} all-gathers did not go through the given "
                        "gather(shard, group): use it for every one, the check follows the gathered "
                        "parameters' lifetime through it")
    return problems


def _alive(reader: Reader) -> list[tuple[str, int, str]]:
    """(name, bytes, "forward"/"backward") of each gathered buffer alive, read as untrusted data."""
    return reader.records(("name", "count", "name"), what="buffers")


def _memory(step: int, seen: Reader, size: dict[str, int]) -> list[str]:
    """The gathered full parameters alive at once against root + one unit, and none left after the step."""
    bound, at = size["root"] + size["unit 0"], f"step {step + 1}"
    events = seen["gathers"].entries(1000, "gathers")
    regathered = any(e["backward"].value is True for e in events)
    peak, at_peak = max(((sum(b for _, b, _ in _alive(e["alive"])), e) for e in events), default=(0, None),
                        key=lambda pair: pair[0])
    if peak > bound:
        alive, of = _alive(at_peak["alive"]), str(at_peak["of"].value)[:80]
        said = [a + (" (for backward)" if p == "backward" else "") for a, _, p in alive]
        held = f"peak {peak} B of gathered full parameters alive at once ({', '.join(said)})"
        if not regathered:
            return [f"{at}: {held}, over root + one unit = {bound} B: every unit was gathered once and kept "
                    "through backward — all parameters whole, as in DDP. Free a unit's full parameters when its "
                    "forward ends and gather them again in its backward."]
        stale = [s for s, (a, _, _) in zip(said[:-1], alive) if a != "root"]   # the last: the gather just made
        where = of + (" for backward" if at_peak["backward"].value is True else "")
        return [f"{at}: {held} at the gather of {where}, over root + one unit = {bound} B. Not freed after use: "
                f"{', '.join(stale) or 'the root, gathered twice'}. A view keeps the gathered tensor alive — a W "
                "kept on ctx or saved with ctx.save_for_backward(W), or saved by autograd when W requires grad: "
                "save activations only, gather again in backward."]
    after = _alive(seen["alive_after"])
    if after:
        return [f"{at}: after fsdp_step returned, the gathered parameters of {', '.join(a for a, _, _ in after)} "
                f"({sum(b for _, b, _ in after)} B) are still alive: a global, a cache, or a tensor autograd saved "
                "still references them"]
    return []


_S = nbytes(2)   # the summary's numbers, for the 2 ranks the check runs on
SUMMARY = (f"{STEPS} SGD steps on 2 ranks equal one process on both batches; each unit is all-gathered before "
           f"forward and again before backward and its gradient reduce-scattered: {3 * UNITS * _S['unit 0'] // 2} B "
           f"a step for the units, 1.5× DDP's {UNITS * _S['unit 0']} B; at most root + one unit = "
           f"{_S['root'] + _S['unit 0']} B of full parameters alive at once (all of them: {sum(_S.values())} B)")


@register("zero3_unit", nproc=2, observe=observe, given={"gather": tracked_gather, "views": views}, summary=SUMMARY,
          deadlock_hint="Likely: the ranks make different collectives or in another order — every rank gathers "
          "and reduce-scatters the same units in the same order (autograd runs backward in reverse on each).")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    net, size = model(), nbytes(n)
    steps = observed.items(STEPS)
    for step, seen in enumerate(steps):
        problems = _values(me, n, step, seen, net)
        if problems:
            return problems
    for step, seen in enumerate(steps):
        problems = _traffic(step, seen, n, size) + _memory(step, seen, size)
        if problems:
            return problems
    return []
