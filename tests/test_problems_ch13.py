"""Chapter 13's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def zb_h1_memory(g):
    """Stage s holds p − s micro-batches under 1F1B (Narayanan et al. 2021 §2.2.1) and p under ZB-H1 (Qi et al.
    2024 §2.1); a layer keeps 34·sbh/t bytes with tp = t, sequence parallelism and selective recompute, b = 1
    (Korthikanti et al. 2022, Table 2)."""
    per_layer = 34 * g["s"] * g["h"] / 8
    return g["stage"] * g["l"] / g["p"] * per_layer / 1e9


def matching_microbatches(g):
    """The least whole m′ with m′ + p − 1 ≥ (m(F+B+W) + (p−1)(F+B−W)) / (F+B−W), i.e. m′ ≥ m(F+B+W)/(F+B−W)."""
    whole = g["m"] * (g["F"] + g["B"] + g["W"])
    return -(-whole // (g["F"] + g["B"] - g["W"]))


INDEPENDENT = {
    "13.zb-h1-bubble": lambda g: 100 * (g["p"] - 1) / (3 * g["m"] + g["p"] - 1),
    "13.zb-h1-saving": lambda g: 2 * (g["p"] - 1) * g["W"],
    "13.zb-h1-memory": zb_h1_memory,
    "13.matching-microbatches": matching_microbatches,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("13"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
