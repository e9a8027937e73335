"""Pipeline schedules as plain data, and a simulator that runs them.

    partrain-edu pipeline --stages 4 --microbatches 8 --schedule 1f1b --json   # bubble 3/11, peaks [4,3,2,1]

A schedule is, for each stage, the ordered list of what that stage computes: ``Action(kind, microbatch,
chunk)`` with kind ``F`` (forward), ``B`` (backward; with ``W`` folded in unless the schedule splits it) or
``W`` (weight gradient). The simulator below and the real executor (``parallel/pipeline.py``) both walk the
same lists in order, each action waiting for the ones it needs:

    F(mb, v) after F(mb, v−1)        B(mb, v) after F(mb, v) and B(mb, v+1)        W(mb, v) after B(mb, v)

where v = chunk·p + stage is the *virtual* stage (p stages, V chunks each; v = stage when V = 1).

Schedules, for p stages and m micro-batches (uniform costs F, B, W; bubble = idle / (p × makespan)):

- ``naive``: no micro-batching; the whole batch (m micro-batches' worth, so each action costs m times more
  and holds m micro-batches of activations) goes through the stages one after the other. Bubble (p−1)/p.
- ``gpipe`` (Huang et al. 2019, §2.3): all m forwards, then all m backwards. Bubble (p−1)/(m+p−1); every
  stage holds m micro-batches of activations.
- ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021 §2.2.1): stage s runs min(p−s−1, m) warm-up forwards,
  then alternates one forward, one backward. Same bubble as GPipe, but stage s holds at most p−s.
- ``interleaved`` (Narayanan et al. 2021 §2.2.2): each stage holds V chunks (virtual stages s, s+p, …),
  each costing 1/V; micro-batches go in groups of p, Megatron-LM's order. Bubble (p−1)/(V·m+p−1); needs
  m to be a multiple of p.
- ``zb-h1`` (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", §2.1, Figure 3 top): 1F1B with the
  backward split into B (input gradient, on the critical path) and W (weight gradient, free to move).
  Stage s delays its W's by s steps, so every stage keeps p micro-batches in flight (stage 0's 1F1B peak)
  and the late W's fill the cool-down. Idle time per stage (p−1)(F+B−W) instead of 1F1B's (p−1)(F+B+W):
  one third when F = B = W (the simulator gives exactly this whenever m ≥ p and W ≤ F).

Activations are counted from the start of a forward to the end of the action that frees them (W when
split, else B), in micro-batch units per chunk (a chunk's share is 1/V of the stage's layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved", "zb-h1")
KINDS = ("F", "B", "W")


@dataclass(frozen=True)
class Action:
    kind: str          # "F", "B" or "W"
    microbatch: int
    chunk: int = 0     # which of the stage's model chunks (interleaved); 0 otherwise


@dataclass(frozen=True)
class Schedule:
    name: str
    stages: int
    microbatches: int
    chunks: int
    actions: tuple[tuple[Action, ...], ...]   # actions[stage]: what that stage runs, in order
    split_backward: bool = False              # True when W runs separately from B
    batch_scale: int = 1                      # micro-batches of data per action (naive: all m at once)


def _one_f_one_b(p: int, m: int, s: int) -> list[Action]:
    warmup = min(p - s - 1, m)
    acts = [Action("F", i) for i in range(warmup)]
    for i in range(m - warmup):  # steady state: one forward, one backward
        acts += [Action("F", warmup + i), Action("B", i)]
    return acts + [Action("B", i) for i in range(m - warmup, m)]  # cool-down


def _zb_h1(p: int, m: int, s: int) -> list[Action]:
    acts = []
    delay = s  # W(j) runs after B(j + s): s extra micro-batches in flight
    next_w = 0
    for action in _one_f_one_b(p, m, s):
        acts.append(action)
        if action.kind == "B" and action.microbatch >= delay:
            acts.append(Action("W", next_w))
            next_w += 1
    return acts + [Action("W", j) for j in range(next_w, m)]


def _interleaved(p: int, m: int, v: int, s: int) -> list[Action]:
    # Megatron-LM forward_backward_pipelining_with_interleaving: the k-th forward runs micro-batch
    # (k // pv)·p + k % p on chunk (k // p) % v; backwards walk the chunks in reverse.
    def action(kind: str, k: int) -> Action:
        chunk = (k % (p * v)) // p
        return Action(kind, (k // (p * v)) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    total = m * v
    warmup = total if m == p else min((p - s - 1) * 2 + (v - 1) * p, total)
    acts = [action("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        acts += [action("F", warmup + i), action("B", i)]
    return acts + [action("B", k) for k in range(total - warmup, total)]


def build_schedule(name: str, stages: int, microbatches: int, chunks: int = 1) -> Schedule:
    """The per-stage action lists of schedule ``name`` (one of SCHEDULES)."""
    p = stages
    m = microbatches
    v = chunks
    for flag, value in (("--stages", p), ("--microbatches", m), ("--chunks", v)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{flag} must be a positive whole number, got {value!r}")
    if name not in SCHEDULES:
        raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    if name == "interleaved":
        if v < 2:
            raise ValueError("interleaved needs --chunks 2 or more (with one chunk it is 1f1b)")
        if m % p:
            raise ValueError(f"interleaved needs --microbatches a multiple of --stages {p}, got {m}")
        lists = [_interleaved(p, m, v, s) for s in range(p)]
    elif v != 1:
        raise ValueError(f"--chunks only applies to --schedule interleaved; drop it for {name}")
    elif name == "naive":
        lists = [[Action("F", 0), Action("B", 0)] for _ in range(p)]
    elif name == "gpipe":
        lists = [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)] for _ in range(p)]
    elif name == "1f1b":
        lists = [_one_f_one_b(p, m, s) for s in range(p)]
    else:
        lists = [_zb_h1(p, m, s) for s in range(p)]
    return Schedule(name, p, m, v, tuple(tuple(a) for a in lists), split_backward=name == "zb-h1",
                    batch_scale=m if name == "naive" else 1)


@dataclass(frozen=True)
class Event:
    stage: int
    microbatch: int
    chunk: int
    kind: str
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    schedule: Schedule
    events: tuple[Event, ...]          # in the order each stage ran them
    makespan: float
    busy: tuple[float, ...]            # per stage, time spent computing
    idle: tuple[float, ...]            # per stage, makespan − busy
    bubble_fraction: float             # Σ idle / (stages × makespan)
    peak_activations: tuple[int, ...]  # per stage, most micro-batch activations held at once
    inflight: tuple[tuple[tuple[float, int], ...], ...]  # per stage, (time, activations held) steps

    def to_dict(self) -> dict:
        """The ``pipeline --json`` object."""
        return {"makespan": self.makespan, "bubble_fraction": self.bubble_fraction,
                "peak_activations": list(self.peak_activations),
                "events": [{"stage": e.stage, "microbatch": e.microbatch, "chunk": e.chunk, "kind": e.kind,
                            "start": e.start, "end": e.end} for e in self.events]}

    def table(self) -> str:
        sch = self.schedule
        lines = [f"{sch.name}: {sch.stages} stages, {sch.microbatches} micro-batches"
                 + (f", {sch.chunks} chunks" if sch.chunks > 1 else ""),
                 f"makespan {self.makespan:g}, bubble {self.bubble_fraction:.4f}",
                 f"  {'stage':<7}{'busy':>9}{'idle':>9}{'peak act':>10}   order"]
        for s in range(sch.stages):
            order = " ".join(f"{a.kind}{a.microbatch}" + (f".{a.chunk}" if sch.chunks > 1 else "")
                             for a in sch.actions[s])
            lines.append(f"  {s:<7}{self.busy[s]:>9g}{self.idle[s]:>9g}{self.peak_activations[s]:>10}   "
                         + (order if len(order) <= 60 else order[:57] + "..."))
        return "\n".join(lines)


def _check_complete(schedule: Schedule) -> None:
    kinds = KINDS if schedule.split_backward else ("F", "B")
    m = 1 if schedule.batch_scale > 1 else schedule.microbatches
    want = sorted((k, mb, c) for k in kinds for mb in range(m) for c in range(schedule.chunks))
    for s, acts in enumerate(schedule.actions):
        if sorted((a.kind, a.microbatch, a.chunk) for a in acts) != want:
            raise ValueError(f"stage {s} of schedule {schedule.name!r} must run each of {', '.join(kinds)} "
                             "exactly once per micro-batch and chunk")


def simulate(schedule: Schedule, t_forward: float = 1.0, t_backward: float = 2.0, t_weight: float = 0.0,
             stage_costs: list[float] | None = None) -> SimResult:
    """Run ``schedule``: every stage executes its list in order, each action starting as soon as the stage
    is free and the actions it depends on have finished.

    ``t_forward``/``t_backward``/``t_weight`` are the costs of one micro-batch through one whole stage
    (a chunk costs 1/V of it); a schedule without a separate W runs B + W as its "B". ``stage_costs``
    multiplies each stage's costs (load imbalance: e.g. ``[1, 1, 1, 1.5]`` when the last stage also
    computes the logits). Times are added exactly (fractions) and reported as floats.
    """
    p, v = schedule.stages, schedule.chunks
    costs = [t_forward, t_backward, t_weight] + list(stage_costs or [])
    if any(not isinstance(c, (int, float, Fraction)) or c != c or c < 0 for c in costs):
        raise ValueError("--t-forward, --t-backward, --t-weight and stage costs must be numbers >= 0")
    if stage_costs is not None and len(stage_costs) != p:
        raise ValueError(f"stage_costs needs one number per stage ({p}), got {len(stage_costs)}")
    _check_complete(schedule)
    f, b, w = (Fraction(t) for t in (t_forward, t_backward, t_weight))
    base = {"F": f, "B": b if schedule.split_backward else b + w, "W": w}
    scale = [Fraction(c) * schedule.batch_scale / v for c in (stage_costs or [1] * p)]
    frees = "W" if schedule.split_backward else "B"

    def needs(a: Action, s: int) -> list[tuple[str, int, int]]:
        vs = a.chunk * p + s
        if a.kind == "F":
            return [("F", a.microbatch, vs - 1)] if vs > 0 else []
        if a.kind == "B":
            return [("F", a.microbatch, vs)] + ([("B", a.microbatch, vs + 1)] if vs < p * v - 1 else [])
        return [("B", a.microbatch, vs)]

    finished: dict[tuple[str, int, int], Fraction] = {}
    next_index, free_at = [0] * p, [Fraction(0)] * p
    timed: list[list[tuple[Action, Fraction, Fraction]]] = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while next_index[s] < len(schedule.actions[s]):
                a = schedule.actions[s][next_index[s]]
                deps = needs(a, s)
                if any(d not in finished for d in deps):
                    break
                start = max([free_at[s]] + [finished[d] for d in deps])
                end = start + base[a.kind] * scale[s]
                finished[a.kind, a.microbatch, a.chunk * p + s] = free_at[s] = end
                timed[s].append((a, start, end))
                next_index[s] += 1
                progress = True
    stuck = [s for s in range(p) if next_index[s] < len(schedule.actions[s])]
    if stuck:
        waits = [(s, schedule.actions[s][next_index[s]]) for s in stuck[:4]]
        raise ValueError(f"schedule {schedule.name!r} deadlocks: " + ", ".join(
            f"stage {s} waits at {a.kind}{a.microbatch} chunk {a.chunk}" for s, a in waits)
            + "; reorder those stages' actions")

    makespan = max(free_at)
    busy = [sum((end - start for _, start, end in timed[s]), Fraction(0)) for s in range(p)]
    idle = [makespan - busy_s for busy_s in busy]
    bubble = sum(idle) / (p * makespan) if makespan else Fraction(0)
    inflight, peaks = [], []
    for s in range(p):  # +batch_scale when a forward starts, − when its W (or B) ends; frees first on ties
        steps = sorted([(start, 1, schedule.batch_scale) for a, start, _ in timed[s] if a.kind == "F"]
                       + [(end, 0, -schedule.batch_scale) for a, _, end in timed[s] if a.kind == frees])
        held, curve = 0, [(0.0, 0)]
        for t, _, delta in steps:
            held += delta
            curve.append((float(t), held))
        inflight.append(tuple(curve))
        peaks.append(max(h for _, h in curve))
    events = tuple(Event(s, a.microbatch, a.chunk, a.kind, float(start), float(end))
                   for s in range(p) for a, start, end in timed[s])
    return SimResult(schedule, events, float(makespan), tuple(map(float, busy)), tuple(map(float, idle)),
                     float(bubble), tuple(peaks), tuple(inflight))


def bubble_formula(schedule: str, stages: int, microbatches: int, chunks: int = 1, t_forward: float = 1.0,
                   t_backward: float = 2.0, t_weight: float = 0.0) -> tuple[str, Fraction] | None:
    """The closed-form bubble of ``schedule`` for equal stages, as (text, value); None where there is none:
    naive (p−1)/p; GPipe and 1F1B (p−1)/(m+p−1) (Huang et al. 2019); interleaved (p−1)/(v·m+p−1)
    (Narayanan et al. 2021); ZB-H1 (p−1)(F+B−W)/(m(F+B+W)+(p−1)(F+B−W)) (Qi et al. 2024)."""
    p = stages
    m = microbatches
    v = chunks
    if schedule == "naive":
        return f"(p−1)/p = {p - 1}/{p}", Fraction(p - 1, p)
    if schedule in ("gpipe", "1f1b"):
        return f"(p−1)/(m+p−1) = {p - 1}/{m + p - 1}", Fraction(p - 1, m + p - 1)
    if schedule == "interleaved":
        return f"(p−1)/(v·m+p−1) = {p - 1}/{v * m + p - 1}", Fraction(p - 1, v * m + p - 1)
    # The bubble is homogeneous in F, B, W: read them relative to the largest, so costs in seconds (1.3e-3) keep
    # their ratios as well as costs in ms do, and small fractions stay readable (1/3, not a binary expansion).
    scale = max(t_forward, t_backward, t_weight) or 1.0
    f, b, wt = (Fraction(x / scale).limit_denominator(10**6) for x in (t_forward, t_backward, t_weight))
    if schedule == "zb-h1" and m >= p and wt <= f:
        idle = (p - 1) * (f + b - wt)
        return "(p−1)(F+B−W)/(m(F+B+W)+(p−1)(F+B−W))", idle / (m * (f + b + wt) + idle)
    return None
