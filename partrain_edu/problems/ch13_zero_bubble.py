"""Problems of chapter 13 (zero bubble): ZB-H1's bubble, its shorter step, the memory its late W's hold.

Keys come from `theory.schedules` (build_schedule, simulate: the makespan, idle time and activations each stage
holds; bubble_formula: 1F1B's and ZB-H1's closed forms) and `theory.memory.activation_bytes_per_layer`, the
functions notebook 13 sets beside the executor's timeline.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import activation_bytes_per_layer
from partrain_edu.theory.schedules import bubble_formula, build_schedule, simulate

ZB = "Qi et al. 2024 (Zero Bubble Pipeline Parallelism) §2.1, Figure 3"


def _sim(name: str, p: int, m: int, f: float = 1, b: float = 1, w: float = 1):
    return simulate(build_schedule(name, p, m), f, b, w)


def _match(p: int, m: int, f: int, b: int, w: int) -> int:
    """The fewest micro-batches whose 1F1B bubble is no larger than ZB-H1's at m (costs F, B, W)."""
    target = bubble_formula("zb-h1", p, m, 1, f, b, w)[1]
    return next(k for k in range(1, 100 * m) if bubble_formula("1f1b", p, k)[1] <= target)


@problem("13.zb-h1-bubble", "ZB-H1's bubble fraction", unit="%", kind="one step",
         formula="bubble = (p−1)(F+B−W) / (m(F+B+W) + (p−1)(F+B−W)); with F = B = W: (p−1)/(3m + p−1)",
         source=f"{ZB}; notebook 13, 'ZB-H1 on the simulator'")
def zb_h1_bubble(rng) -> Drawn:
    p = rng.choice([4, 6, 8, 12, 16])
    m = p * rng.choice([1, 2, 3, 4]) + rng.choice([0, 0, 2, 4])
    zb = _sim("zb-h1", p, m)
    key = 100 * zb.bubble_fraction
    return Drawn(f"A pipeline of p = {p} stages runs m = {m} micro-batches per step under ZB-H1, with the forward "
                 "F, the input gradient B and the weight gradient W each taking the same time. What percentage of "
                 "the stages' time is idle (the bubble)?", key, given={"p": p, "m": m},
                 mistakes=[(100 * float(bubble_formula("1f1b", p, m)[1]), "1F1B's (p−1)/(m+p−1): ZB-H1's late W's "
                            "fill most of the cool-down"),
                           (100 * sum(zb.idle) / sum(zb.busy), "idle over busy time: the bubble divides the idle time "
                            "by the whole step, p × makespan"),
                           (100 * float(bubble_formula("1f1b", p, m)[1]) / 3, "1F1B's bubble divided by 3: the idle "
                            "time falls to a third, but the step it divides by shrinks too")])


@problem("13.zb-h1-saving", "How much shorter ZB-H1's step is than 1F1B's", unit="ms", kind="judgement",
         formula="1F1B: (m+p−1)(F+B+W); ZB-H1: m(F+B+W) + (p−1)(F+B−W) (W ≤ F, m ≥ p); saved = 2(p−1)·W",
         source=f"{ZB}; notebook 13, 'ZB-H1 on the simulator'")
def zb_h1_saving(rng) -> Drawn:
    p = rng.choice([4, 8, 12, 16])
    m = p * rng.choice([1, 2, 4])
    f = rng.randint(20, 90) / 10
    b = round(f * rng.uniform(1.0, 1.3), 1)
    w = round(f * rng.uniform(0.5, 1.0), 1)
    one = _sim("1f1b", p, m, f, b, w)
    zb = _sim("zb-h1", p, m, f, b, w)
    key = one.makespan - zb.makespan
    return Drawn(f"A pipeline of {p} stages runs {m} micro-batches per step; per stage and micro-batch the forward "
                 f"takes F = {f:g} ms, the input gradient B = {b:g} ms and the weight gradient W = {w:g} ms (1F1B "
                 "runs B and W together). How many ms shorter is a ZB-H1 step than a 1F1B step?", key,
                 given={"p": p, "m": m, "F": f, "B": b, "W": w},
                 mistakes=[(key / 2, "(p−1)·W: the idle per stage falls from (p−1)(F+B+W) to (p−1)(F+B−W), by "
                            "two W's per stage boundary"),
                           (sum(one.idle) - sum(zb.idle), "the idle time of all p stages summed: the step is as long "
                            "as one stage's, it shortens once"),
                           (one.makespan - _sim("zb-h1", p, m, f, b, 0).makespan, "ZB-H1's step priced without its "
                            "W's: they still run, in the bubbles")])


@problem("13.zb-h1-memory", "Activations ZB-H1's late W's hold", unit="GB", kind="several steps",
         formula="stage s holds p − s micro-batches under 1F1B and p under ZB-H1: extra = s · (l/p) · activations "
                 "per layer and micro-batch (Korthikanti et al. 2022, Table 2)",
         source=f"{ZB}; Korthikanti et al. 2022 §4; notebook 13, 'ZB-H1 on the simulator'")
def zb_h1_memory(rng) -> Drawn:
    p = rng.choice([4, 8, 16])
    layers, hidden = rng.choice([(32, 4096), (48, 6144), (64, 8192), (80, 8192)])
    heads = hidden // 128
    seq = rng.choice([2048, 4096])
    stage = rng.randint(2, p - 2)
    m = 2 * p
    first_b = next(i for i, a in enumerate(build_schedule("1f1b", p, m).actions[stage]) if a.kind == "B")
    warmup = first_b - 1        # 1F1B's warm-up forwards: the forward before the first B is the steady state's
    shape = dict(seq=seq, micro_batch=1, hidden=hidden, heads=heads, tp=8, sequence_parallel=True)
    per_layer = activation_bytes_per_layer(**shape, recompute="selective")
    held = {name: _sim(name, p, m).peak_activations[stage] for name in ("1f1b", "zb-h1")}
    per_microbatch = layers // p * per_layer
    key = (held["zb-h1"] - held["1f1b"]) * per_microbatch / 1e9
    return Drawn(f"A GPT (l = {layers}, h = {hidden}, a = {heads}) is split into p = {p} pipeline stages, each "
                 f"with tp = 8 and sequence parallelism, selective recompute, s = {seq}, micro-batch 1, "
                 f"m = {m} micro-batches. How many GB more activations does stage {stage} (counting from 0) hold at "
                 "its peak under ZB-H1 than under 1F1B (Korthikanti et al.'s bf16 bytes)?", key,
                 given={"p": p, "l": layers, "h": hidden, "a": heads, "s": seq, "stage": stage},
                 mistakes=[(held["zb-h1"] * per_microbatch / 1e9, "ZB-H1's whole peak, p micro-batches, not the "
                            "difference"),
                           (key * p, "all l layers counted: a stage holds its own l/p"),
                           ((p - warmup) * per_microbatch / 1e9, "1F1B's stage taken to hold only its "
                            "warm-up forwards, p − s − 1: the steady state's forward adds one"),
                           ((held["zb-h1"] - held["1f1b"]) * layers // p
                            * activation_bytes_per_layer(**shape, recompute="selective", element_bytes=4) / 1e9,
                            "fp32's 4 bytes per value: the table counts 16-bit activations")])


@problem("13.matching-microbatches", "Micro-batches 1F1B needs to match ZB-H1's bubble", unit="micro-batches",
         kind="several steps",
         formula="(p−1)/(m′+p−1) ≤ (p−1)(F+B−W)/(m(F+B+W)+(p−1)(F+B−W)) ⇔ m′ ≥ m(F+B+W)/(F+B−W)",
         source=f"{ZB}; Narayanan et al. 2021 §2.2.1; notebook 13, 'ZB-H1 on the simulator'")
def matching_microbatches(rng) -> Drawn:
    p = rng.choice([4, 6, 8])
    m = p * rng.choice([1, 2, 3])
    f = rng.randint(4, 12)
    b = f + rng.randint(0, 3)
    w = rng.randint(f // 2, f - 1)
    key = _match(p, m, f, b, w)
    return Drawn(f"ZB-H1 runs m = {m} micro-batches on p = {p} stages with F = {f}, B = {b}, W = {w} ms. What is "
                 "the fewest micro-batches 1F1B, on the same stages, needs for a bubble fraction no larger than "
                 "ZB-H1's?", key, given={"p": p, "m": m, "F": f, "B": b, "W": w},
                 mistakes=[(_match(p, m, 1, 1, 1), "F = B = W assumed: with these costs the W's fill a different "
                            "share"),
                           (_match(p, m, f, b + w, 0), "ZB-H1's idle taken as 1F1B's (p−1)(F+B+W): its late W's "
                            "fill the cool-down"),
                           (_match(p, m, f, b, w) - 1, "rounded down: one micro-batch fewer leaves 1F1B's bubble "
                            "larger")])
