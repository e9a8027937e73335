"""Chapter 06's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def _stage_activations(g):
    """1F1B's stage 0 holds min(p, m) micro-batches of l/p layers, each sbh(34 + 5as/h) bytes (Korthikanti)."""
    sbh = g["s"] * g["b"] * g["h"]
    per_layer = sbh * (34 + 5 * g["a"] * g["s"] / g["h"])
    return min(g["p"], g["m"]) * g["layers"] / g["p"] * per_layer / 1e9


def _fewest_microbatches(g):
    """(p−1)/(m+p−1) ≤ x  ⇔  m ≥ (p−1)(1−x)/x; the small epsilon keeps exact ties (x = 1/5, p−1 = 4) at m."""
    return math.ceil((g["p"] - 1) * (1 - g["x"]) / g["x"] - 1e-9)


INDEPENDENT = {
    "06.bubble": lambda g: 100 * (g["p"] - 1) / (g["m"] + g["p"] - 1),
    # a middle stage: one b·s·h 16-bit activation forward and its gradient back, per micro-batch
    "06.boundary-bytes": lambda g: 2 * g["m"] * g["b"] * g["s"] * g["h"] * 2 / 1e6,
    "06.stage-activations": _stage_activations,
    "06.microbatches-for-a-bubble": _fewest_microbatches,
    # (m+p−1)(F+B) against (m+(p−1)/v)(F+B)
    "06.interleaving-saves": lambda g: (g["p"] - 1) * (g["F"] + g["B"]) * (1 - 1 / g["v"]),
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("06"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
