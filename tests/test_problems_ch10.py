"""Chapter 10's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def ring_step(g):
    """Liu et al. 2023: each rank's K and V block, 2·b·(s/c)·h·e bytes, hops c − 1 times forward; backward sends it
    again and the dK, dV accumulators as often: 3(c − 1) blocks per layer and micro-batch."""
    c = g["cp"]
    block = 2 * 1 * (g["seq"] / c) * g["hidden"] * 2
    return 3 * (c - 1) * block * g["layers"] * g["m"] / 1e9


def activations_cp(seq, b, h, a, c):
    """Korthikanti et al. 2022, Table 2, no recompute, with the rank's s/c queries: sbh(34 + 5as/h) / c."""
    return seq * b * h * (34 + 5 * a * seq / h) / c


def activations_tp(seq, b, h, a, t):
    """Korthikanti et al. 2022, Table 2, tensor parallel without sequence parallelism: sbh(10 + 24/t + 5as/(ht))."""
    return seq * b * h * (10 + 24 / t + 5 * a * seq / (h * t))


def longest_sequence(g):
    """16Ψ/N + l · 34 · (s/c) · h ≤ 0.9 · M, solved for s (selective recompute, micro-batch 1)."""
    room = g["tight"] * g["memory"] - 16 * g["psi"] / g["n"]
    return g["cp"] * room / (g["layers"] * 34 * g["hidden"]) / 1e3


INDEPENDENT = {
    "10.gqa-all-gather": lambda g: (g["cp"] - 1) / g["cp"] * 2 * g["tokens"] * g["kv"] * g["head_dim"] * 2 / 2**20,
    "10.ring-step": ring_step,
    "10.activations-per-rank": lambda g: activations_cp(g["seq"], g["b"], g["hidden"], g["heads"], g["cp"]) / 1e9,
    "10.longest-sequence": longest_sequence,
    "10.cp-or-tp": lambda g: (activations_tp(g["seq"], g["b"], g["hidden"], g["heads"], g["n"])
                              - activations_cp(g["seq"], g["b"], g["hidden"], g["heads"], g["n"])) / 1e9,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("10"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
