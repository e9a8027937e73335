"""Chapter 01's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]
INDEPENDENT = {
    "01.ring-all-reduce": lambda g: 2 * (g["n"] - 1) * g["S"] / g["n"] / 1e6,
    "01.all-gather": lambda g: (g["n"] - 1) * g["shard"] / 1e6,
    "01.alpha-beta": lambda g: 1e3 * (2 * (g["n"] - 1) * g["alpha"]
                                      + 2 * (g["n"] - 1) / g["n"] * g["S"] / (g["gbits"] / 8 * 1e9)),
    "01.bus-bandwidth": lambda g: g["S"] / g["t"] * 2 * (g["n"] - 1) / g["n"] / 1e9,
    "01.naive-vs-ring": lambda g: g["n"] / 2,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("01"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
