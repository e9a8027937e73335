"""Check `sharded_optimizer`, the trusted half: plain torch.optim recomputed here, single-process, and what a
rank's observations differ from it in — values, optimizer state, traffic — worded with a hint.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from partrain_edu.grading.checks.sharded_optimizer.observe import (FROZEN, NAMES, RUNS, SIZES, STEPS,
                                                                   TRAINABLE_BYTES, batch_of, make_model, options_of,
                                                                   params_arg, state_bytes)
from partrain_edu.grading.compare import differ
from partrain_edu.grading.observations import Malformed, Reader

RTOL, ATOL = 1e-5, 1e-6
GATHERS = ("broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base")


@functools.lru_cache(maxsize=None)
def _reference(i: int, n: int):
    """Plain single-process torch.optim on the averaged gradients: parameters before/after each step, the state
    bytes per parameter after each step, each parameter's group options."""
    run = RUNS[i]
    model = make_model()
    params = list(model.parameters())
    index = {id(p): k for k, p in enumerate(params)}
    opt = run.cls(params_arg(run, model), **run.defaults)
    trainable = [p for p in params if p.requires_grad]
    values, states = [[p.detach().clone() for p in params]], []
    for step in range(STEPS):
        with torch.enable_grad():  # the caller's kernel may have turned autograd off
            local = [torch.autograd.grad(F.mse_loss(model(x), y), trainable)
                     for x, y in (batch_of(i, step, r) for r in range(n))]
        for k, p in enumerate(trainable):
            p.grad = torch.stack([g[k] for g in local]).sum(0) / n
        opt.step()
        values.append([p.detach().clone() for p in params])
        states.append(state_bytes(opt, index)[0])
    return values, states, options_of(opt, index, run.option), model.shift.clone()


def _option_table(reader: Reader) -> list:
    tables = [item.value for item in reader.items(len(NAMES))]
    if not all(t is None or isinstance(t, dict) and len(str(t)) <= 300 for t in tables):
        raise Malformed(f"{reader.where} is not a list of option tables")
    return tables


ADAMW_STATE = 2 * TRAINABLE_BYTES + 4 * (len(SIZES) - len(FROZEN))  # two moments + a 4-byte step per tensor
ADAMW_BOUND = ADAMW_STATE / 2 + (2 * max(SIZES[k] for k in range(len(SIZES)) if k not in FROZEN) + 4) / 2   # n = 2


def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for i, seen in enumerate(observed.items(len(RUNS))):
        problems = _verify_run(i, me, n, seen)
        if problems:
            return problems
    return []


def _verify_run(i: int, me: int, n: int, seen: Reader) -> list[str]:
    run = RUNS[i]
    values, states, options, shift = _reference(i, n)
    owned = [set(r.numbers(len(NAMES))) for r in seen["owned"].items(n)]
    owners = {k: [r for r in range(n) if k in owned[r]] for k in range(len(NAMES))}
    mine, got_options = owned[me], _option_table(seen["options"])
    optim, is_class = seen["optim"].value, seen["is_class"].value
    for s, step in enumerate(seen["steps"].items(STEPS)):
        where = f"{run.name}, step {s + 1}"
        left = step["left"].numbers(len(NAMES))
        if left and s > 0:
            return [f"{where}: after your zero_grad() {NAMES[left[0]]} still held last step's gradient, which the "
                    "next backward adds to — clear (set to None) the gradients of every parameter you were given, "
                    "owned or not"]
        for k, got in enumerate(p.tensor() for p in step["params"].items(len(NAMES))):
            problem = differ(f"{where}: {NAMES[k]} after step()", values[s + 1][k], got, RTOL, ATOL)
            if problem:
                return [problem + _value_hint(k, s, got, values, owners, me, options, got_options)]
        problem = differ(f"{where}: the buffer `shift`", shift, step["buffer"].tensor(), RTOL, ATOL)
        if problem:
            return [problem + ". A buffer is not a parameter: the optimizer must leave it alone"]
        if optim is None or is_class is not True:
            return [f"{run.name}: " + ("your object has no attribute `optim`: expose the inner optimizer as `.optim` "
                    "(as torch's ZeroRedundancyOptimizer does) so the check can weigh its state" if optim is None
                    else f"`.optim` is a {str(optim)[:60]}, not the {run.cls.__name__} you were asked to wrap")]
        problem = _state_problem(where, run, me, n, step, states[s], owned, owners)
        if problem:
            return [problem]
        problem = _traffic_problem(where, me, n, step, mine)
        if problem:
            return [problem]
    return []


def _value_hint(k, s, got, values, owners, me, options, got_options) -> str:
    if k in FROZEN:
        return (". It is frozen (requires_grad=False): leave it out of the inner optimizer, give it no "
                "gradient and no state, and send it nowhere")
    for j, (want, have) in enumerate(zip(options, got_options)):
        if have is not None and have != want:
            return (f". Your inner optimizer steps {NAMES[j]} with {have}, its param group asks {want}: keep each "
                    "param group's options — build the inner groups as {**group, 'params': the ones you own}")
    if isinstance(got, torch.Tensor) and differ("", values[s][k], got, RTOL, ATOL) is None:
        if not owners[k]:
            return ". It never changed: no rank's inner optimizer steps it (every trainable parameter needs one owner)"
        if me not in owners[k]:
            return (f". It still holds its value from before this step: rank {owners[k][0]} owns and updated it, "
                    f"but the update never reached rank {me} — after stepping, broadcast each parameter from its "
                    "owner so every rank holds the same model")
    return (". Hint: step the inner optimizer on the gradients as they arrive (already averaged), then broadcast "
            "each parameter from its owner")


def _state_problem(where, run, me, n, step, expected, owned, owners) -> str | None:
    """The optimizer-state rules (ZeRO P_os): one owner per trainable parameter, its state on that rank only."""
    per, foreign = [c.count() for c in step["state"].items(len(NAMES))], step["foreign"].count()
    held, whole, largest = sum(per) + foreign, sum(expected), max(expected)
    if n > 1 and held >= whole:
        everyone = all(len(owners[k]) == n for k in range(len(NAMES)) if k not in FROZEN)
        return (f"{where}: rank {me} holds {held} B of optimizer state (优化器状态) — the whole single-process "
                f"state is {whole} B" + (": every rank keeps state for every parameter" if everyone else "") +
                f". ZeRO-1 keeps on each rank only the state of the parameters it owns, about 1/{n} of it")
    for k in sorted(FROZEN):
        if owners[k] or per[k]:
            return (f"{where}: the frozen parameter {NAMES[k]} (requires_grad=False) is in rank(s) "
                    f"{owners[k] or [me]}'s inner optimizer: frozen parameters get no owner, no state, no traffic")
    for k in range(len(NAMES)):
        if k not in FROZEN and len(owners[k]) != 1:
            return (f"{where}: {NAMES[k]} is stepped by " + (f"ranks {owners[k]}" if owners[k] else "no rank") +
                    ": every trainable parameter must have exactly one owner, the same on every rank")
    for k in range(len(NAMES)):
        want = expected[k] if k in owned[me] else 0
        if per[k] != want:
            return (f"{where}: rank {me} holds {per[k]} B of state for {NAMES[k]}, "
                    + (f"which rank {owners[k][0]} owns: a rank keeps state only for its own parameters" if not want
                       else f"which it owns; single-process {run.cls.__name__} keeps {want} B for it"))
    if foreign:
        return (f"{where}: {foreign} B of `.optim`'s state belong to tensors that are not the model's parameters: "
                "build the inner optimizer over the parameter tensors you were given (the check weighs its state)")
    bound = whole / n + (1 - 1 / n) * largest
    if held > bound:
        return (f"{where}: rank {me} holds {held} B of the {whole} B of optimizer state; balanced shards keep "
                f"each rank ≤ S/n + (1 − 1/n)·s_max = {bound:.0f} B (s_max = {largest} B, the largest "
                "parameter's) — assign each parameter to the least-loaded rank, largest first")
    return None


def _traffic_problem(where, me, n, step, mine) -> str | None:
    """ZeRO-1's step moves each updated trainable parameter once, from its owner to every other rank."""
    ops = step["ops"].counts()
    other = sorted(set(ops) - {*GATHERS, "barrier"})
    if other:
        return (f"{where}: step() called {other}" + (": the gradients arrive already averaged (data "
                "parallelism's all-reduce, done by the check) — a ZeRO-1 step only sends the updated parameters"
                if "all_reduce" in other else ": send the updated parameters with broadcast (or all_gather) only"))
    payload = sum(step["bytes"].counts().get(op, 0) for op in GATHERS)
    received = step["received"].count()
    expected = sum(b for k, b in enumerate(SIZES) if k not in FROZEN and k not in mine)
    if (payload, received) == (TRAINABLE_BYTES, expected):
        return None
    frozen = sum(SIZES[k] for k in FROZEN)
    if payload - TRAINABLE_BYTES == frozen or received - expected == frozen:
        return (f"{where}: {frozen} B more travelled — the frozen parameter's: it never changes, so no rank "
                "needs it sent")
    return (f"{where}: rank {me} received {received} B in {sum(ops.values())} call(s) carrying {payload} B; "
            f"ZeRO-1 sends each trainable parameter once from its owner: payload B = {TRAINABLE_BYTES} B, and "
            f"rank {me} receives B − B_{me} = {expected} B (the parameters it does not own)"
            + (": more means padding or parameters sent twice" if received > expected else ""))
