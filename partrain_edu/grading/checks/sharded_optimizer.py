"""Check `sharded_optimizer` (exercise 09): a ZeRO-1 sharded optimizer (零冗余优化器) that wraps any torch.optim
class on any model, like torch.distributed.optim.ZeroRedundancyOptimizer (Rajbhandari et al. 2020, §5.1, P_os).

On 2 ranks, 3 runs × 3 steps — AdamW and SGD-momentum over two param groups, SGD over model.parameters() — of a
small model (2-D, 1-D and 0-D parameters, one frozen, a buffer). The ranks average the gradients themselves
(all-reduce outside the traced window) before each `step()`. Graded, from values recomputed here single-process:
1. every parameter after each step equals plain torch.optim on the averaged gradients; frozen one and buffer kept;
2. optimizer state, weighed by walking `opt.optim.state` (the documented inner optimizer): each trainable
   parameter is stepped by exactly one rank, the frozen one by none; a rank holds exactly the single-process
   state of the parameters it owns, at most S/n + (1 − 1/n)·s_max bytes (S: the whole state, s_max: the
   largest parameter's; Graham's bound for greedy least-loaded assignment);
3. traffic per step: broadcast / all-gather only (no all-reduce), carrying B = Σ bytes(p) over the trainable
   parameters once, rank r receiving B − B_r (B_r: the bytes of the parameters it owns).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ
from partrain_edu.grading.core import register
from partrain_edu.grading.observations import Malformed, Reader
from partrain_edu.grading.rank_observe import observer, tensor, traffic

STEPS, SEED = 3, 9
RTOL, ATOL = 1e-5, 1e-6
GATHERS = ("broadcast", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base")


class _Net(nn.Module):
    """Mixed shapes and sizes: a frozen input projection (pretrained, requires_grad=False), Linear weights and
    biases, LayerNorm, a 0-D temperature, and a buffer that no optimizer may touch."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Parameter(torch.randn(8, 12) * 0.3, requires_grad=False)
        self.fc1 = nn.Linear(12, 8)
        self.norm = nn.LayerNorm(8)
        self.fc2 = nn.Linear(8, 8)
        self.head = nn.Linear(8, 4)
        self.temperature = nn.Parameter(torch.tensor(1.5))
        self.register_buffer("shift", torch.linspace(-0.5, 0.5, 4))

    def forward(self, x):
        h = self.norm(F.gelu(self.fc1(x @ self.embed)))
        h = h + torch.tanh(self.fc2(h))
        return self.head(h) / self.temperature + self.shift


def _model() -> _Net:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return _Net()


def _batch(run: int, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1000 + 100 * run + 10 * step + rank)
        return torch.randn(4, 8), torch.randn(4, 4)


@dataclass(frozen=True)
class _Run:
    name: str
    cls: type
    defaults: dict
    groups: tuple | None  # options of (the 2-D weights, the rest); None: model.parameters() as it comes
    option: str           # the class's own option reported besides lr and weight_decay


RUNS = (
    _Run("AdamW over two param groups", torch.optim.AdamW, {"lr": 1e-2, "betas": (0.9, 0.95)},
         ({"weight_decay": 0.1}, {"lr": 3e-2, "weight_decay": 0.0}), "betas"),
    _Run("SGD-momentum over two param groups", torch.optim.SGD, {"lr": 0.05, "momentum": 0.9},
         ({"weight_decay": 0.1}, {"lr": 0.15, "weight_decay": 0.0}), "momentum"),
    _Run("SGD-momentum over model.parameters()", torch.optim.SGD,
         {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}, None, "momentum"),
)
_REFERENCE = _model()
NAMES = [name for name, _ in _REFERENCE.named_parameters()]
FROZEN = {k for k, p in enumerate(_REFERENCE.parameters()) if not p.requires_grad}
SIZES = [p.numel() * p.element_size() for p in _REFERENCE.parameters()]
TRAINABLE_BYTES = sum(b for k, b in enumerate(SIZES) if k not in FROZEN)


def _params_arg(run: _Run, model: nn.Module):
    """What the optimizer is given: GPT-style groups (weight decay on the 2-D weights only), or a generator."""
    if run.groups is None:
        return model.parameters()
    weights = [p for p in model.parameters() if p.dim() == 2]  # the frozen projection among them
    rest = [p for p in model.parameters() if p.dim() != 2]
    return [{"params": weights, **run.groups[0]}, {"params": rest, **run.groups[1]}]


def _plain(value):  # an option as JSON: numbers as floats, betas as a list
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value[:4]]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)[:40]


def _options(optim, index: dict, option: str) -> list:
    """Per parameter of the model: the lr, weight_decay and `option` of the inner group stepping it, or None."""
    out = [None] * len(index)
    for g in getattr(optim, "param_groups", []):
        for p in g.get("params", []):
            if id(p) in index:
                out[index[id(p)]] = {k: _plain(g.get(k)) for k in ("lr", "weight_decay", option)}
    return out


def _state_bytes(optim, index: dict) -> tuple[list[int], int]:
    """Bytes of optimizer state per parameter of the model, and under keys that are not its parameters."""
    per, foreign = [0] * len(index), 0
    for key, state in dict(getattr(optim, "state", {})).items():
        held = sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor)) \
            if isinstance(state, dict) else 0
        if id(key) in index:
            per[index[id(key)]] += held
        else:
            foreign += held
    return per, foreign


@observer("sharded_optimizer")
def observe(ctx, make_sharded_optimizer) -> list[dict]:
    runs = []
    for i, run in enumerate(RUNS):
        model = _model()
        params = list(model.parameters())
        index = {id(p): k for k, p in enumerate(params)}
        opt = make_sharded_optimizer(_params_arg(run, model), run.cls, group=None, **run.defaults)
        steps = []
        for step in range(STEPS):
            opt.zero_grad()
            left = [k for k, p in enumerate(params) if p.grad is not None and bool(p.grad.ne(0).any())]
            for p in params:
                p.grad = None  # reported above; this step's gradient alone from here on
            x, y = _batch(i, step, ctx.rank)
            F.mse_loss(model(x), y).backward()
            for p in params:  # data parallelism's job, done here, outside the traced window
                if p.grad is not None:
                    dist.all_reduce(p.grad)
                    p.grad /= ctx.world_size
            with CommTracer() as tracer:
                opt.step()
            per, foreign = _state_bytes(getattr(opt, "optim", None), index)
            steps.append({"left": left, "params": [tensor(p) for p in params], "buffer": tensor(model.shift),
                          "state": per, "foreign": foreign, **traffic(tracer),
                          "received": sum(r.received for r in tracer.records)})
        inner = getattr(opt, "optim", None)
        options = _options(inner, index, run.option)
        owned = [None] * ctx.world_size  # who steps what, gathered untraced for the partition check
        dist.all_gather_object(owned, [k for k, o in enumerate(options) if o is not None])
        runs.append({"optim": None if inner is None else type(inner).__name__[:60],
                     "is_class": isinstance(inner, run.cls), "owned": owned, "options": options, "steps": steps})
    return runs


# --- the trusted half -----------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _reference(i: int, n: int):
    """Plain single-process torch.optim on the averaged gradients: parameters before/after each step, the state
    bytes per parameter after each step, each parameter's group options."""
    run = RUNS[i]
    model = _model()
    params = list(model.parameters())
    index = {id(p): k for k, p in enumerate(params)}
    opt = run.cls(_params_arg(run, model), **run.defaults)
    trainable = [p for p in params if p.requires_grad]
    values, states = [[p.detach().clone() for p in params]], []
    for step in range(STEPS):
        with torch.enable_grad():  # the caller's kernel may have turned autograd off
            local = [torch.autograd.grad(F.mse_loss(model(x), y), trainable)
                     for x, y in (_batch(i, step, r) for r in range(n))]
        for k, p in enumerate(trainable):
            p.grad = torch.stack([g[k] for g in local]).sum(0) / n
        opt.step()
        values.append([p.detach().clone() for p in params])
        states.append(_state_bytes(opt, index)[0])
    return values, states, _options(opt, index, run.option), model.shift.clone()


def _option_table(reader: Reader) -> list:
    tables = [item.value for item in reader.items(len(NAMES))]
    if not all(t is None or isinstance(t, dict) and len(str(t)) <= 300 for t in tables):
        raise Malformed(f"{reader.where} is not a list of option tables")
    return tables


_ADAMW_STATE = 2 * TRAINABLE_BYTES + 4 * (len(SIZES) - len(FROZEN))  # two moments + a 4-byte step per tensor
_ADAMW_BOUND = _ADAMW_STATE / 2 + (2 * max(SIZES[k] for k in range(len(SIZES)) if k not in FROZEN) + 4) / 2


@register("sharded_optimizer", nproc=2, summary="3 steps each of AdamW and SGD-momentum (two param groups, a "
          "frozen parameter) equal single-process torch.optim; each rank holds only its own parameters' optimizer "
          f"state (AdamW: ≤ {_ADAMW_BOUND:.0f} B of S = {_ADAMW_STATE} B on 2 ranks; the frozen one none); a step "
          f"sends each trainable parameter once from its owner, B = {TRAINABLE_BYTES} B, rank r receiving B − B_r",
          deadlock_hint="Likely: the ranks disagree on who owns which parameter, or walk the parameters in "
          "different orders — compute the assignment the same way on every rank (from sizes and positions, "
          "never from anything rank-local) and broadcast every trainable parameter, in the same order.")
def verify(me: int, n: int, observed: Reader) -> list[str]:
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
