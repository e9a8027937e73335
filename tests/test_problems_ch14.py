"""Chapter 14's problem keys against an independent computation from the given numbers, for several seeds."""
import math
from fractions import Fraction

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def cap(g):
    """GShard / Switch: C = ⌈capacity_factor · N·k / E⌉, exactly (the factor as the decimal it is written)."""
    return math.ceil(Fraction(str(g["cf"])) * g["N"] * g["k"] / g["E"])


def aux_loss(g):
    """Switch Transformer eq. 4: α · E · Σ f_i · P_i, f_i = the share of the tokens expert i receives."""
    f = [load / sum(g["load"]) for load in g["load"]]
    return g["alpha"] * len(f) * sum(fi * pi for fi, pi in zip(f, g["P"], strict=True))


def capped_imbalance(g):
    kept = [min(load, cap(g)) for load in g["load"]]
    return max(kept) / (sum(kept) / len(kept))


def padded_vs_exact(g):
    padded = (g["n"] - 1) * (g["E"] // g["n"]) * cap(g) * g["H"] * 2
    exact = sum(rows for j, rows in enumerate(g["rows"]) if j != g["rank"]) * g["H"] * 2
    return (padded - exact) / 1e6


INDEPENDENT = {
    "14.capacity": cap,
    "14.dropped": lambda g: sum(max(0, load - cap(g)) for load in g["load"]),
    "14.aux-loss": aux_loss,
    "14.capped-imbalance": capped_imbalance,
    "14.padded-vs-exact": padded_vs_exact,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("14"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
