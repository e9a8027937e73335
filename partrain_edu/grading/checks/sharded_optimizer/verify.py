"""Check `sharded_optimizer`, the trusted half: plain torch.optim recomputed here, single-process, on the drawn
configurations (setups.py), and what a rank's observations differ from it in — group, values, optimizer state,
traffic — worded with a hint where the evidence points to a cause.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from partrain_edu.grading.checks.sharded_optimizer.setups import STEPS, Setup, options_of, setups, state_bytes
from partrain_edu.grading.compare import differ
from partrain_edu.grading.observations import Malformed, Reader
from partrain_edu.grading.registry import Problem

RTOL, ATOL = 1e-5, 1e-6
GATHERS = ("broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base")


@functools.lru_cache(maxsize=8)
def _reference(seed: int, i: int):
    """Plain single-process torch.optim on the averaged gradients of configuration i: the parameters before and
    after each step, the state bytes per parameter after each step, each parameter's options, the buffer."""
    s = setups(seed)[i]
    model = s.model()
    params = list(model.parameters())
    index = {id(p): k for k, p in enumerate(params)}
    opt = s.cls(s.params_arg(model), **dict(s.defaults))
    trainable = [p for p in params if p.requires_grad]
    values, states = [[p.detach().clone() for p in params]], []
    for step in range(STEPS):
        with torch.enable_grad():  # the caller's kernel may have turned autograd off
            local = [torch.autograd.grad(F.mse_loss(model(x), y), trainable)
                     for x, y in (s.batch(step, r) for r in s.ranks)]
        for k, p in enumerate(trainable):
            p.grad = torch.stack([g[k] for g in local]).sum(0) / len(s.ranks)
        opt.step()
        values.append([p.detach().clone() for p in params])
        states.append(state_bytes(opt, index)[0])
    names = [name for name, _ in model.named_parameters()]
    return values, states, options_of(opt, index, s.keys), model.shift.clone(), names


def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    drawn = setups(seed)
    for i, (s, seen) in enumerate(zip(drawn, observed.items(len(drawn)), strict=True)):
        problem = _verify_run(seed, i, s, me, seen) if me in s.ranks else None
        if problem:
            return [problem]
    return []


def _option_table(reader: Reader, count: int) -> list:
    tables = [item.value for item in reader.items(count)]
    if not all(t is None or isinstance(t, dict) and len(str(t)) <= 400 for t in tables):
        raise Malformed(f"{reader.where} is not a list of option tables")
    return tables


def _verify_run(seed: int, i: int, s: Setup, me: int, seen: Reader) -> Problem | None:
    values, states, options, shift, names = _reference(seed, i)
    n, count = len(s.ranks), len(names)
    owned = [set(r.numbers(count)) for r in seen["owned"].items(n)]   # in group order
    owners = {k: [s.ranks[r] for r in range(n) if k in owned[r]] for k in range(count)}   # global ranks
    run = dict(s=s, me=me, names=names, owners=owners, mine=owned[s.ranks.index(me)],
               strangers=seen["strangers"].count())
    got_options = _option_table(seen["options"], count)
    optim, is_class = seen["optim"].value, seen["is_class"].value
    for step_no, step in enumerate(seen["steps"].items(STEPS)):
        where = f"{s.name}, step {step_no + 1}"

        def at(phase, step_no=step_no):
            return (i, step_no, phase)

        wrong = step["wrong_group"].records(("name", "count"), 8, "calls") or \
            (seen["built_wrong"].records(("name", "count"), 8, "calls") if step_no == 0 else [])
        if wrong:
            used = [r for r in range(8) if wrong[0][1] >> r & 1]
            return Problem(f"{where}: your code called dist.{wrong[0][0]} over ranks {used}, but the group is "
                           f"{list(s.ranks)}: pass group=group to every collective (the check ran it over the group, "
                           "so that the run could go on)", at=at(0))
        roots = step["roots"].records(("name", "count"), 8, "calls")
        if roots:
            return Problem(f"{where}: your code called dist.{roots[0][0]}, but rank {roots[0][1]} is not in the "
                           f"group {list(s.ranks)}: src and dst are *global* ranks — dist.get_global_rank(group, r) "
                           f"turns group rank r into one (the check read it as group rank {roots[0][1]}, so that the "
                           "run could go on)", at=at(0))
        left = step["left"].numbers(count)
        if left and step_no > 0:
            return Problem(f"{where}: after your zero_grad() {names[left[0]]} still held last step's gradient, "
                           "which the next backward adds to — clear (set to None) the gradients of every parameter "
                           "you were given, owned or not", at=at(1))
        if optim is not None and is_class is not True:
            return Problem(f"{s.name}: `.optim` is a {str(optim)[:60]}, not the {s.kind} you were asked to wrap: "
                           "build the inner optimizer with optimizer_class, whatever class it is", at=at(2))
        for k, got in enumerate(p.tensor() for p in step["params"].items(count)):
            problem = differ(f"{where}: {names[k]} after step()", values[step_no + 1][k], got, RTOL, ATOL)
            if problem:
                return Problem(problem + _value_hint(run, k, values[step_no], got, options, got_options), at=at(2))
        problem = differ(f"{where}: the buffer `shift`", shift, step["buffer"].tensor(), RTOL, ATOL)
        if problem:
            return Problem(problem + ". A buffer is not a parameter: the optimizer must leave it alone", at=at(2))
        if optim is None:
            return Problem(f"{s.name}: your object has no attribute `optim`: expose the inner optimizer as `.optim` "
                           "(as torch's ZeroRedundancyOptimizer does) so the check can weigh its state", at=at(3))
        problem = _state_problem(where, run, step, states[step_no], owned)
        if problem:
            return Problem(problem, at=at(3))
        problem = _traffic_problem(where, run, step)
        if problem:
            return Problem(problem, at=at(4))
    return None


def _value_hint(run: dict, k: int, before: list[torch.Tensor], got, options: list, got_options: list) -> str:
    s = run["s"]
    me = run["me"]
    names = run["names"]
    owners = run["owners"]
    if k in s.frozen:
        return (". It is frozen (requires_grad=False): leave it out of the inner optimizer, give it no gradient and "
                "no state, and send it nowhere")
    for j, (want, have) in enumerate(zip(options, got_options, strict=True)):
        if have is not None and have != want:
            return (f". Your inner optimizer steps {names[j]} (shape {tuple(before[j].shape)}) with {have}, its "
                    f"param group asks {want}: keep each param group's options — build the inner groups as "
                    "{**group, 'params': the ones you own}")
    if isinstance(got, torch.Tensor) and differ("", before[k], got, RTOL, ATOL) is None:
        if not owners[k] and run["strangers"]:
            return (f". It never changed: `.optim` steps {run['strangers']} tensor(s) that are not the model's "
                    "parameters — build the inner optimizer over the very parameter tensors you were given")
        if not owners[k]:
            return ". It never changed: no rank's inner optimizer steps it (every trainable parameter needs one owner)"
        if me not in owners[k]:
            return (f". It still holds its value from before this step: rank {owners[k][0]} owns and updated it, "
                    f"but the update never reached rank {me} — after stepping, broadcast each parameter from its "
                    "owner so every rank holds the same model")
    return (". Hint: step the inner optimizer on the gradients as they arrive (already averaged), then broadcast "
            "each parameter from its owner")


def _state_problem(where: str, run: dict, step: Reader, expected: list[int], owned: list[set]) -> str | None:
    """The optimizer-state rules (ZeRO P_os): one owner per trainable parameter, its state on that rank only."""
    s = run["s"]
    me = run["me"]
    names = run["names"]
    owners = run["owners"]
    n, count = len(s.ranks), len(names)
    per, foreign = [c.count() for c in step["state"].items(count)], step["foreign"].count()
    held = sum(per) + foreign
    whole = sum(expected)
    largest = max(expected)
    if held >= whole:
        everyone = all(len(owners[k]) == n for k in range(count) if k not in s.frozen)
        return (f"{where}: rank {me} holds {held} B of optimizer state (优化器状态) — the whole single-process "
                f"state is {whole} B" + (": every rank keeps state for every parameter" if everyone else "") +
                f". ZeRO-1 keeps on each rank only the state of the parameters it owns, about 1/{n} of it")
    for k in s.frozen:
        if owners[k] or per[k]:
            return (f"{where}: the frozen parameter {names[k]} (requires_grad=False) is in rank(s) "
                    f"{owners[k] or [me]}'s inner optimizer: frozen parameters get no owner, no state, no traffic")
    for k in range(count):
        if k not in s.frozen and len(owners[k]) != 1:
            return (f"{where}: {names[k]} is stepped by " + (f"ranks {owners[k]}" if owners[k] else "no rank") +
                    ": every trainable parameter must have exactly one owner, the same on every rank")
    for k in range(count):
        want = expected[k] if k in run["mine"] else 0
        if per[k] != want:
            return (f"{where}: rank {me} holds {per[k]} B of state for {names[k]}, "
                    + (f"which rank {owners[k][0]} owns: a rank keeps state only for its own parameters" if not want
                       else f"which it owns; single-process {s.kind} keeps {want} B for it"))
    if foreign:
        return (f"{where}: {foreign} B of `.optim`'s state belong to tensors that are not the model's parameters: "
                "build the inner optimizer over the parameter tensors you were given (the check weighs its state)")
    bound = whole / n + (1 - 1 / n) * largest
    if held > bound:
        return (f"{where}: rank {me} holds {held} B of the {whole} B of optimizer state; balanced shards keep "
                f"each rank ≤ S/n + (1 − 1/n)·s_max = {bound:.0f} B (s_max = {largest} B, the largest "
                "parameter's) — assign each parameter to the least-loaded rank, largest first")
    return None


def _traffic_problem(where: str, run: dict, step: Reader) -> str | None:
    """ZeRO-1's step moves each updated trainable parameter once, from its owner to every other rank."""
    s = run["s"]
    me = run["me"]
    mine = run["mine"]
    ops = step["ops"].counts()
    other = sorted(set(ops) - {*GATHERS, "barrier"})
    if other:
        return (f"{where}: step() called {other}" + (": the gradients arrive already averaged (data "
                "parallelism's all-reduce, done by the check) — a ZeRO-1 step only sends the updated parameters"
                if "all_reduce" in other else ": send the updated parameters with broadcast (or all_gather) only"))
    sizes = [p.numel() * p.element_size() for p in s.model().parameters()]
    trainable = sum(b for k, b in enumerate(sizes) if k not in s.frozen)
    payload = sum(step["bytes"].counts().get(op, 0) for op in GATHERS)
    received = step["received"].count()
    expected = sum(b for k, b in enumerate(sizes) if k not in s.frozen and k not in mine)
    if (payload, received) == (trainable, expected):
        return None
    frozen = sum(sizes[k] for k in s.frozen)
    if payload - trainable == frozen or received - expected == frozen:
        return (f"{where}: {frozen} B more travelled — the frozen parameters': they never change, so no rank "
                "needs them sent")
    return (f"{where}: rank {me} received {received} B in {sum(ops.values())} call(s) carrying {payload} B; "
            f"ZeRO-1 sends each trainable parameter once from its owner: payload B = {trainable} B, and "
            f"rank {me} receives B − B_{me} = {expected} B (the parameters it does not own)"
            + (": more means padding or parameters sent twice" if received > expected else ""))
