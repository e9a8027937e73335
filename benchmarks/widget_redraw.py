"""How long does a widget take to redraw when a control moves?

    python benchmarks/widget_redraw.py [--repeats 21] [--json]
    python benchmarks/widget_redraw.py --json > before.json     # … change the code …
    python benchmarks/widget_redraw.py --before before.json     # before | now | goal, per widget

Moves a control the way the page does (``app.controls[name].value = …``, alternating between two values) and
times until the new PNG is in the widget's Output: theory + figure + Agg draw + PNG encoding, everything but
the trip to the browser. For each widget it reports the median wall-clock time and the median CPU time of this
process. On a machine shared with other work, wall-clock time also counts the time the other processes hold
the CPUs; the CPU time does not, and is close to what the same redraw takes on an idle machine (compare
runs made under the same load: a busy machine slows even the CPU time through shared caches). For the
pipeline it also reports the share spent in the simulator (``theory.schedules.simulate``).

Goals (issues 4 and 7): memory ≤ 50 ms; pipeline at p = 16, m = 64, traffic and planner ≤ 100 ms. Moving the
model size redraws the memory widget's scale and title as well as its bars: no goal, shown for reference.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import matplotlib

matplotlib.use("Agg")

from partrain_edu.theory.schedules import build_schedule, simulate  # noqa: E402
from partrain_edu.viz import memory_widget, pipeline_widget, planner_widget, traffic_widget  # noqa: E402

GOALS_MS = {"memory: ZeRO stage": 50, "memory: dp": 50, "pipeline p=16 m=64": 100, "traffic: ring step": 100,
            "traffic: dp": 100, "planner": 100}


def timed(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and median CPU milliseconds of ``fn(i)`` over ``repeats`` calls."""
    wall, cpu = [], []
    for i in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn(i)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def measure(repeats: int) -> dict:
    """{case: {"wall_ms", "cpu_ms", "goal_ms"}} for every widget and control below."""
    mem, pipe, traffic = memory_widget(), pipeline_widget(stages=16, microbatches=64), traffic_widget()
    cases = [("memory: ZeRO stage", mem, "zero", (0, 3)), ("memory: dp", mem, "dp", (8, 64)),
             ("memory: model size", mem, "params", ("7.5B", "13B")),
             ("pipeline p=16 m=64", pipe, "t_forward", (1.0, 1.25)),
             ("traffic: ring step", traffic, "step", (1, 2)), ("traffic: dp", traffic, "dp", (8, 64)),
             ("planner", planner_widget(), "gpus", (64, 128))]
    results = {}
    for name, app, control, values in cases:
        def move(i, app=app, control=control, values=values):
            app.controls[control].value = values[i % 2]
        wall, cpu = timed(move, repeats)
        assert not any(s.error for s in app.sections), [s.error for s in app.sections]
        results[name] = {"wall_ms": round(wall, 1), "cpu_ms": round(cpu, 1), "goal_ms": GOALS_MS.get(name)}
    schedule = build_schedule("1f1b", 16, 64)
    _, sim_cpu = timed(lambda i: simulate(schedule, 1.0, 2.0, 0.0), repeats)
    results["pipeline p=16 m=64"]["simulator_cpu_ms"] = round(sim_cpu, 1)
    return results


def table(results: dict, before: dict, repeats: int, load: float) -> str:
    """One line per case: the earlier run's CPU ms (if given), this run's wall and CPU ms, the goal."""
    lines = [f"widget redraw, medians of {repeats} moves ({os.cpu_count()} CPUs, load average {load:.1f})",
             f"  {'widget: control moved':<24}{'before CPU':>11}{'wall ms':>9}{'CPU ms':>9}   goal"]
    for name, r in results.items():
        was = before.get(name, {}).get("cpu_ms")
        goal = r["goal_ms"]
        verdict = "" if goal is None else (f"≤ {goal} ms: CPU {'yes' if r['cpu_ms'] <= goal else 'NO'}, "
                                           f"wall {'yes' if r['wall_ms'] <= goal else 'NO'}")
        lines.append(f"  {name:<24}{'—' if was is None else f'{was:.1f}':>11}{r['wall_ms']:>9.1f}"
                     f"{r['cpu_ms']:>9.1f}   {verdict}")
    sim = results["pipeline p=16 m=64"]["simulator_cpu_ms"]
    lines.append(f"  (of the pipeline's CPU time, the simulator takes {sim:.1f} ms)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--before", metavar="FILE", help="a --json output of an earlier run, shown beside this one")
    args = parser.parse_args()
    before = {}
    if args.before:
        with open(args.before) as f:
            before = json.load(f)["redraw"]
    results = measure(args.repeats)
    load = os.getloadavg()[0]
    if args.json:
        print(json.dumps({"cpus": os.cpu_count(), "load_average_1min": round(load, 2), "repeats": args.repeats,
                          "redraw": results}))
    else:
        print(table(results, before, args.repeats, load))


if __name__ == "__main__":
    main()
