"""Chapter 12's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def ring(n):
    """The share of S one rank sends in each half of a ring all-reduce: (n−1)/n."""
    return (n - 1) / n


def activation_saving(g):
    """Korthikanti et al. 2022, Table 2 with e bytes per value and 1-byte masks: (16e + 2)·sbh + (2e + 1)·a·s²·b
    per layer; the model states cancel (2 + 2 + 12 = 4 + 4 + 8 B per parameter)."""
    sbh = g["s"] * g["b"] * g["h"]
    scores = g["a"] * g["s"] ** 2 * g["b"]
    per_layer = {e: (16 * e + 2) * sbh + (2 * e + 1) * scores for e in (2, 4)}
    return g["l"] * (per_layer[4] - per_layer[2]) / 1e9


INDEPENDENT = {
    "12.grad-reduce-bf16": lambda g: 2 * ring(g["n"]) * g["psi"] * (4 - 2) / 1e9,
    "12.fsdp-policy-bytes": lambda g: g["m"] * (2 * ring(g["n"]) * 2 * g["psi"] + ring(g["n"]) * 4 * g["psi"]) / 1e9,
    "12.distopt-states": lambda g: (2 * g["psi"] + 4 * g["psi"] + 12 * math.ceil(g["psi"] / g["nd"])) / 1e9,
    "12.activation-saving": activation_saving,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("12"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
