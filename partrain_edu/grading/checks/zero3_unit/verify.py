"""Check `zero3_unit`, the verify half: one rank's observations against one process training its group's whole
model on every member's batch (recomputed here, in float64, from the seed), then against FSDP's traffic and the
bound on gathered parameters alive at once (see the package's docstring).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from partrain_edu.grading.checks.zero3_unit.observe import (
    NPROC,
    WORLD,
    Run,
    batch,
    flat,
    mine,
    model,
    nbytes,
    runs,
    shard,
)
from partrain_edu.grading.compare import NotATensor, differ, ratio_of
from partrain_edu.grading.observations import Reader
from partrain_edu.grading.registry import Problem

GATHERS = ("all_gather_into_tensor", "all_gather")
REDUCE_SCATTERS = ("reduce_scatter_tensor", "reduce_scatter")
TOL = {"rtol": 1e-4, "atol": 1e-5}   # float32 on the ranks against float64 here


def _near(want: torch.Tensor, got) -> bool:
    """The evidence a hint stands on: `got` equals `want` up to float32 rounding of one step's move."""
    return isinstance(got, torch.Tensor) and got.shape == want.shape and \
        differ("", want, got, rtol=1e-3, atol=1e-6) is None


def _forward(params: list, x: torch.Tensor) -> torch.Tensor:
    h = x
    for w, b in params[1:]:
        h = torch.tanh(h @ w.T + b)
    return h @ params[0][0].T + params[0][1]


def _stray(seen: Reader, members: tuple[int, ...]) -> str:
    """'your all_gather… ran on ranks […]' when a call of this step left the group, else ''."""
    ops = [op for op, _ in seen["calls"].records(("name", "count"), what="calls")]
    ranks = [tuple(g.numbers(NPROC)) for g in seen["groups"].entries(1000, "groups")]
    return next((f"your {op} ran on ranks {list(r)}, not on the group {list(members)}: pass `group` to gather and "
                 "to every collective" for op, r in zip(ops, ranks, strict=True) if r != members), "")


def _update_hint(want: torch.Tensor, got: torch.Tensor, alone: torch.Tensor, last, n: int) -> str:
    """Why a shard moved by `got` instead of `want` (after − before this step; `alone`: by this rank's gradient;
    `last`: the move the previous step owed, None at the first)."""
    if bool((got == 0).all()):
        return " The shard did not move: update it in place (under torch.no_grad()) with its gradient shard."
    if last is not None and _near(want + last, got):
        return (" It moved by this step's gradient plus the last step's: autograd adds into a .grad that is "
                "already there, and the last step's gradient was still in it — clear it (shard.grad = None) once "
                "the update has used it.")
    r = ratio_of(want, got)
    if n > 1 and r is not None and abs(r - n) < 1e-2:
        return f" It moved {r:.3g}× too far: the reduce-scatter sums the ranks' gradients; divide by n = {n}."
    if n > 1 and r is not None and abs(r - 1 / n) < 1e-3:
        also = f", or divided by the world's {NPROC} ranks instead of the group's {n}" if NPROC == n * n else ""
        return f" It moved 1/{n} as far: the gradient was averaged twice{also}."
    if n > 1 and r is not None and abs(n / r - round(n / r)) < 1e-3 * n / r:
        return f" It moved {r:.3g}× as far: the summed gradient was divided by {round(n / r)}, not by n = {n}."
    if n > 1 and _near(alone, got):
        return " It moved by this rank's own gradient: reduce-scatter the unit's full gradient across the group."
    return (" Hint: shard ← shard − lr·ḡ, ḡ this rank's 1/n of the full padded gradient, reduce-scattered over "
            "the group and divided by n.")


def _values(seed: int, k: int, run: Run, step: int, me: int, seen: Reader, params: list, last) -> tuple[list, list]:
    """Loss, shards, x.grad and inputs of one step against one process on every member's batch; steps `params`
    by SGD. Returns (problems, each shard's move this step)."""
    members = mine(run.layout, me)[1]
    n = len(members)
    i = members.index(me)
    at = k, step, 0
    flat_params = [p for pair in params for p in pair]
    batches = [tuple(t.double() for t in batch(seed, k, step, r, run)) for r in members]
    x_me = batches[i][0].clone().requires_grad_()
    with torch.enable_grad():   # the learner's kernel may have turned autograd off
        losses = [F.mse_loss(_forward(params, x_me if r == i else x), y) for r, (x, y) in enumerate(batches)]
        grads = torch.autograd.grad(torch.stack(losses).mean(), flat_params, retain_graph=True)  # every batch
        local = torch.autograd.grad(losses[i], [*flat_params, x_me])
    when = f"step {step + 1}"
    problem = differ(f"{when}, loss on rank {me}'s batch", losses[i].detach(), seen["loss"].tensor(), **TOL)
    if problem:
        if _stray(seen, members):
            problem += f": {_stray(seen, members)}"
        elif step:
            problem += f": the update of step {step} left some parameters wrong"
        else:
            problem += (f". Hint: unit k computes h ← tanh(h·Wₖᵀ + bₖ) with W, b = views(gather(shard, group), "
                        f"[({run.d}, {run.d}), ({run.d},)]), the root ŷ = h·Wᵀ + b, loss = F.mse_loss(ŷ, y)")
        return [Problem(problem, at=(*at, 0))], []
    before = [shard(flat(w, b, n), i, n) for w, b in params]
    with torch.no_grad():
        for p, g in zip(flat_params, grads, strict=True):
            p -= run.lr * g
    moves = [shard(flat(w, b, n), i, n) - old for (w, b), old in zip(params, before, strict=True)]
    shards = seen["shards"].items(len(params))
    for q in (0, *range(len(params) - 1, 0, -1)):   # backward's order: the root, then the last unit first
        got = shards[q].tensor()
        problem = differ(f"{when}, {run.names[q]}'s shard on rank {me} after the update", before[q] + moves[q], got,
                         **TOL)
        if problem:
            if isinstance(got, torch.Tensor) and got.shape == before[q].shape:
                alone = -run.lr * shard(flat(local[2 * q], local[2 * q + 1], n), i, n)
                problem += "." + _update_hint(moves[q], got - before[q], alone, None if last is None else last[q], n)
            return [Problem(problem, at=(*at, 1, q and len(params) - q))], moves
    got = seen["x_grad"].tensor()
    problem = differ(f"{when}, dL/dx on rank {me} (x.grad, of this rank's loss)", local[-1], got, **TOL)
    if problem:
        r = ratio_of(local[-1], got)
        if isinstance(got, NotATensor):
            problem += (". No gradient reached x: keep it in the graph (do not detach it) — the first unit's "
                        "backward returns dL/dh for its input")
        elif r is not None and n > 1 and abs(r * n - 1) < 1e-3:
            problem += f". It is 1/{n} of it: x.grad is the gradient of this rank's own loss, not of the mean"
        else:
            problem += ". Hint: each unit's backward returns dL/dh for its input h, through tanh and W"
        return [Problem(problem, at=(*at, 2))], moves
    for what, want, got in zip("xy", batches[i], seen["inputs"].items(2), strict=True):
        problem = differ(f"{when}, {what} on rank {me} after fsdp_step", want, got.tensor(), **TOL)
        if problem:
            return [Problem(f"{problem}: x and y are this rank's batch — read them, do not change them",
                            at=(*at, 3))], moves
    return [], moves


def _traffic(run: Run, step: int, seen: Reader, members: tuple[int, ...], size: dict[str, int]) -> list[str]:
    """Kinds, calls and bytes sent of one step against FSDP's: each unit gathered twice, reduce-scattered once."""
    s_root = size["root"]
    s_unit = size["unit"]
    units = run.units
    n = len(members)
    calls = seen["calls"].records(("name", "count"), what="calls")   # (op, payload bytes) of every traced call
    ring = {"all_reduce": 2, **{op: 1 for op in GATHERS + REDUCE_SCATTERS}}
    unit_sent = sum(-(-ring.get(op, 0) * (n - 1) * b // n) for op, b in calls if b == s_unit)
    ddp = 2 * (n - 1) * s_unit * units // n
    tally = {(kind, who): sum(op in ops and b == s for op, b in calls)
             for kind, ops in (("gather", GATHERS), ("reduce", REDUCE_SCATTERS)) for who, s in
             (("root", s_root), ("unit", s_unit))}
    at, problems = f"step {step + 1}", []
    stray = _stray(seen, members)
    if stray:
        return [f"{at}: {stray}"]
    other = sorted({op for op, _ in calls} - set(GATHERS + REDUCE_SCATTERS))
    if other:   # the counts below would only repeat it
        return [f"{at}: you called {other}; FSDP needs only all-gathers (parameters) and reduce-scatters "
                "(gradients)" + (f": an all-reduce hands every rank the whole gradient, 2(n−1)/n·S, though it "
                f"keeps only 1/n — the units sent {unit_sent} B, {unit_sent / ddp:.3g}× DDP's {ddp} B instead of "
                "1.5×" if "all_reduce" in other and ddp else "")]
    odd = sorted({(op, b) for op, b in calls if op in GATHERS + REDUCE_SCATTERS and b not in (s_root, s_unit)})
    if odd:
        problems.append(f"{at}: {odd[0][0]} of {odd[0][1]} B, neither a unit's flat tensor ({s_unit} B) nor the "
                        f"root's ({s_root} B): gather and reduce-scatter each one whole, padding included")
    want = {("gather", "root"): 1, ("gather", "unit"): 2 * units, ("reduce", "root"): 1, ("reduce", "unit"): units}
    why = {("gather", "root"): "once: it stays gathered from its forward through its backward, which comes first",
           ("gather", "unit"): "twice each: before its forward and again before its backward",
           ("reduce", "root"): "once, its whole padded gradient", ("reduce", "unit"): "once each, the whole "
           "padded gradient of the unit"}
    for key, count in want.items():
        if tally[key] != count:
            verb = "all-gathered" if key[0] == "gather" else "reduce-scattered"
            problems.append(f"{at}: {'the root was' if key[1] == 'root' else 'the units were'} {verb} "
                            f"{tally[key]} time(s); expected {count} — {why[key]}")
    expected = units * 3 * -(-(n - 1) * s_unit // n) + 2 * -(-(n - 1) * s_root // n)
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
    bound, at = size["root"] + size["unit"], f"step {step + 1}"
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
        # all but the last: the gather just made
        stale = [s for s, (a, _, _) in zip(said[:-1], alive[:-1], strict=True) if a != "root"]
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


def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    drawn = runs(seed)
    for k, (run, steps) in enumerate(zip(drawn, observed.items(len(drawn)), strict=True)):
        j, members = mine(run.layout, me)
        group = "the default group (all 4 ranks)" if run.layout == WORLD else f"group {list(members)} of 4 ranks"
        said = f"on {group}, d = {run.d}, c = {run.c}, {run.units} units, {run.rows} rows a batch, lr = {run.lr}: "
        params = [(w.double().requires_grad_(), b.double().requires_grad_()) for w, b in model(seed, k, j, run)]
        seen, last = steps.items(run.steps), None
        for step in range(run.steps):
            problems, last = _values(seed, k, run, step, me, seen[step], params, last)
            if problems:
                return [Problem(said + problems[0], at=problems[0].at)]
        size = nbytes(run, len(members))
        for step in range(run.steps):
            problems = _traffic(run, step, seen[step], members, size) + _memory(step, seen[step], size)
            if problems:
                return [Problem(said + p, at=(k, step, 1)) for p in problems]
    return []
