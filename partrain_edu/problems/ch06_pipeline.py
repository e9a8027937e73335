"""Problems of chapter 06 (pipeline parallelism): the bubble, the boundary bytes, the activations a stage holds in
flight, the micro-batches a bubble target needs, and what interleaving saves.

Keys come from `theory.schedules` (bubble_formula; build_schedule and simulate for makespans and the micro-batches
in flight), `theory.traffic.step_traffic` and `theory.memory.activation_bytes_per_layer`, the functions notebook 06
draws and measures its schedules with.
"""
from __future__ import annotations

from fractions import Fraction

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import activation_bytes_per_layer
from partrain_edu.theory.schedules import bubble_formula, build_schedule, simulate
from partrain_edu.theory.traffic import step_traffic

GPIPE = "Huang et al. 2019 §2.3"
ONE_F_ONE_B = "Narayanan et al. 2021 §2.2.1"
# (name, layers, hidden, heads): GPT-3's shapes (Brown et al. 2020, Table 2.1; 1.3B at 16 heads, as Megatron-LM's
# example runs it, so that heads divide the hidden size; 13B at hidden 5120, as OPT-13B)
MODELS = [("1.3B", 24, 2048, 16), ("2.7B", 32, 2560, 32), ("6.7B", 32, 4096, 32), ("13B", 40, 5120, 40)]


def _bubble(schedule: str, p: int, m: int, v: int = 1) -> Fraction:
    return bubble_formula(schedule, p, m, v)[1]


@problem("06.bubble", "The bubble of GPipe or 1F1B", unit="%", kind="one step",
         formula="bubble = (p−1)/(m+p−1): p−1 fill-and-drain slots out of m+p−1 (the same for GPipe and 1F1B)",
         source=f"{GPIPE}; {ONE_F_ONE_B}; notebook 06, 'GPipe: cut the batch into micro-batches'")
def bubble(rng) -> Drawn:
    schedule = rng.choice(["gpipe", "1f1b"])
    p = rng.choice([2, 4, 6, 8, 12, 16])
    m = rng.choice([4, 8, 12, 16, 24, 32, 64])
    key = float(_bubble(schedule, p, m)) * 100
    name = {"gpipe": "GPipe", "1f1b": "1F1B"}[schedule]
    return Drawn(f"A pipeline of p = {p} equal stages runs {m} micro-batches per step under {name}. What share of "
                 "the stages' time is bubble (idle), in %?", key, given={"p": p, "m": m},
                 mistakes=[(float(_bubble("naive", p, m)) * 100, "(p−1)/p is naive model parallelism, without "
                            "micro-batches"),
                           ((p - 1) / m * 100, "idle over busy, (p−1)/m: the bubble is a share of the whole step, "
                            "(p−1)/(m+p−1)"),
                           (key / 100, "a fraction, not a percentage")])


@problem("06.boundary-bytes", "Bytes a middle pipeline stage sends per step", unit="MB", kind="one step",
         formula="sent = 2m · b·s·h·2: each micro-batch's activation forward, its gradient back (16-bit)",
         source=f"{ONE_F_ONE_B}; notebook 06, 'Only boundary activations move'")
def boundary_bytes(rng) -> Drawn:
    p = rng.choice([4, 8, 16])
    h = rng.choice([2048, 4096, 5120, 8192, 12288])
    s = rng.choice([2048, 4096, 8192])
    b = rng.choice([1, 2, 4])
    m = rng.choice([8, 16, 32, 64])
    key = step_traffic("pp", pp=p, hidden=h, seq=s, micro_batch=b, microbatches=m).per_rank_bytes_sent / 1e6
    return Drawn(f"A pipeline of {p} stages runs {m} micro-batches of {b} sequence{'s' * (b > 1)} of {s} tokens "
                 f"per step; the model's hidden size is {h}, activations are 16-bit. How many MB does a middle stage "
                 "send per step?", key, given={"p": p, "h": h, "s": s, "b": b, "m": m},
                 mistakes=[(key / 2, "forward only: a middle stage also sends each activation's gradient back"),
                           (key / m, "one micro-batch: the stage sends its boundary for each of the m"),
                           (key * 2, "fp32 (4 bytes) for 16-bit activations")])


@problem("06.stage-activations", "Activations the first stage holds under 1F1B", unit="GB", kind="several steps",
         formula="stage 0 holds min(p, m) micro-batches (1F1B; GPipe m) × l/p layers × sbh(34 + 5as/h) bytes",
         source=f"{ONE_F_ONE_B}; Korthikanti et al. 2022 Table 2; notebook 06, 'Choosing m'")
def stage_activations(rng) -> Drawn:
    name, layers, h, a = rng.choice(MODELS)
    p = rng.choice([2, 4, 8])
    m = rng.choice([16, 32, 64])
    s = rng.choice([1024, 2048])
    b = rng.choice([1, 2])
    per_layer = activation_bytes_per_layer(seq=s, micro_batch=b, hidden=h, heads=a)
    stage = per_layer * (layers // p)
    in_flight = simulate(build_schedule("1f1b", p, m)).peak_activations[0]
    key = in_flight * stage / 1e9
    return Drawn(f"A {name} GPT ({layers} layers, hidden {h}, {a} heads) is cut into p = {p} equal stages and "
                 f"trained with 1F1B, m = {m} micro-batches of {b} sequence{'s' * (b > 1)} of {s} tokens. With 16-bit "
                 "activations counted as Korthikanti et al. do (no tensor parallelism, no recomputation), how many "
                 "GB of activations does stage 0 hold at its peak?", key,
                 given={"layers": layers, "h": h, "a": a, "p": p, "m": m, "s": s, "b": b},
                 mistakes=[(simulate(build_schedule("gpipe", p, m)).peak_activations[0] * stage / 1e9,
                            "GPipe's count: 1F1B frees a micro-batch's activations after its backward"),
                           (stage / 1e9, "one micro-batch: stage 0 starts p forwards before its first backward"),
                           (in_flight * per_layer * layers / 1e9, "all l layers per micro-batch: a stage holds l/p")])


@problem("06.microbatches-for-a-bubble", "The fewest micro-batches for a bubble target", unit="micro-batches",
         kind="several steps", formula="smallest m with (p−1)/(m+p−1) ≤ x, that is m ≥ (p−1)(1−x)/x",
         source=f"{GPIPE} (m ≥ 4p); notebook 06, 'Choosing m: the \"4–8 micro-batches\" advice, in numbers'")
def microbatches_for_a_bubble(rng) -> Drawn:
    p = rng.choice([3, 4, 6, 8, 12, 16])
    target = rng.choice([5, 8, 10, 12, 15, 20, 25])
    limit = Fraction(target, 100)
    key = next(m for m in range(1, 10_000) if _bubble("1f1b", p, m) <= limit)
    over_busy = next(m for m in range(1, 10_000) if Fraction(p - 1, m) <= limit)
    p_for_p_minus_1 = next(m for m in range(1, 10_000) if _bubble("1f1b", p + 1, m) <= limit)
    slips = [(over_busy, "the bubble taken as (p−1)/m: it is a share of the whole step, (p−1)/(m+p−1)"),
             (p_for_p_minus_1, "p fill slots for p−1: the first stage starts at once, the last waits p−1"),
             (4 * p, "GPipe's rule of thumb m = 4p, not the target asked for")]
    return Drawn(f"A 1F1B pipeline has p = {p} equal stages. What is the smallest number of micro-batches per step "
                 f"that keeps its bubble at or below {target}%?", key, given={"p": p, "x": target / 100},
                 mistakes=slips)


@problem("06.interleaving-saves", "Time one step saves with interleaved 1F1B", unit="ms", kind="judgement",
         formula="1F1B (m+p−1)(F+B), interleaved (m+(p−1)/v)(F+B): saved (p−1)(F+B)(1 − 1/v)",
         source="Narayanan et al. 2021 §2.2.2; notebook 06, 'Interleaved 1F1B: more, smaller stages per device'")
def interleaving_saves(rng) -> Drawn:
    p = rng.choice([2, 4, 8, 16])
    m = p * rng.choice([2, 4, 8])
    v = rng.choice([2, 3, 4])
    f = rng.randint(4, 60) / 2
    back = 2 * f
    plain = simulate(build_schedule("1f1b", p, m), t_forward=f, t_backward=back).makespan
    interleaved = simulate(build_schedule("interleaved", p, m, v), t_forward=f, t_backward=back).makespan
    key = plain - interleaved
    return Drawn(f"A pipeline of p = {p} devices runs m = {m} micro-batches per step; on each device one "
                 f"micro-batch's forward takes {f:g} ms and its backward {back:g} ms. 1F1B, or interleaved 1F1B "
                 f"with v = {v} chunks per device (messages free): how many ms per step does the interleaved "
                 "schedule save?", key, given={"p": p, "m": m, "v": v, "F": f, "B": back},
                 mistakes=[(plain / v * (v - 1), "the whole step divided by v: only the fill and drain shrink"),
                           ((p - 1) * (f + back), "the whole bubble (p−1)(F+B): interleaving divides it by v, it "
                            "does not remove it"),
                           ((p - 1) * f * (v - 1) / v, "the forward fill only: the backward drain shrinks too")])
