"""Chapter 08's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def most_sequences(g):
    """Korthikanti et al. 2022, Table 2: sbh(34 + 5as/h) bytes per layer and sequence kept without recompute, 34sbh
    with selective recompute; ZeRO's 16Ψ of mixed-precision Adam states (Rajbhandari et al. 2020, §3.1)."""
    s, h, a = g["seq"], g["hidden"], g["heads"]
    per_sequence = g["layers"] * s * h * (34 + (5 * a * s / h if g["recompute"] == "none" else 0))
    return math.floor((g["tight"] * g["memory"] - 16 * g["psi"]) / per_sequence)


def planner_choice(g):
    """The simplest family (DDP, FSDP, FSDP × TP, 3D, CP) whose step is within the margin of the fastest."""
    times = g["times"]
    fastest = min(times.values())
    return next(times[f] for f in ("ddp", "fsdp", "fsdp-tp", "3d", "cp")
                if f in times and times[f] <= g["margin"] * fastest)


def slow_network(g):
    n = g["n"]
    beta = g["gbits"] / 8 * 1e9 * g["eff"]
    comm = 2 * (n - 1) * g["alpha"] + 2 * (n - 1) / n * 2 * g["psi"] / beta
    return comm / (6 * g["psi"] * g["seqs"] * g["seq"] / g["flops"])


INDEPENDENT = {
    "08.squeeze-micro-batch": most_sequences,
    "08.one-layer": lambda g: 16 * (12 * g["hidden"] ** 2 + 13 * g["hidden"]) / 1e9,
    "08.zero1-or-fsdp": lambda g: 4 * g["psi"] * (1 - 1 / g["n"]) / 1e9,
    "08.planner-margin": planner_choice,
    "08.slow-network": slow_network,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("08"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
