"""Chapter 15's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def model_flops(g, passes=3):
    """Narayanan et al. 2021 §5.1 per token: `passes` forwards of the layers (24h² + 4sh each; 3 = forward +
    backward, 4 with full recompute) and the logits' 6hV."""
    return g["l"] * passes * (24 * g["h"] ** 2 + 4 * g["s"] * g["h"]) + 6 * g["h"] * g["V"]


def roofline_us(g):
    """Williams et al. 2009: max(F/peak, B/bandwidth) with F = 2mkn, B = 2(mk + kn + mn) bytes in bf16."""
    flops = 2 * g["m"] * g["k"] * g["n"]
    nbytes = 2 * (g["m"] * g["k"] + g["k"] * g["n"] + g["m"] * g["n"])
    return 1e6 * max(flops / g["peak"], nbytes / g["hbm"])


def compute_bound(g):
    """mkn / (mk + kn + mn) ≥ R ⇔ m ≥ R·kn / (kn − R(k + n)), R = peak / bandwidth."""
    ridge = g["peak"] / g["hbm"]
    return math.ceil(ridge * g["k"] * g["n"] / (g["k"] * g["n"] - ridge * (g["k"] + g["n"])))


def hfu_vs_mfu(g):
    mfu_a = g["hfu_a"] * model_flops(g) / model_flops(g, passes=4)
    return abs(g["mfu_b"] - mfu_a)


INDEPENDENT = {
    "15.flops-per-token": lambda g: model_flops(g) / 1e9,
    "15.mfu": lambda g: 100 * g["tokens_s"] * model_flops(g) / (g["N"] * g["peak"]),
    "15.roofline": roofline_us,
    "15.compute-bound": compute_bound,
    "15.hfu-vs-mfu": hfu_vs_mfu,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("15"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
