"""Chapter 05's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def _ring(g):
    return 2 * (g["t"] - 1) / g["t"]        # share of an all-reduce's payload one ring rank sends


def _tp_memory(g):
    """16Ψ/t of model states (mixed-precision Adam) + L · sbh(10 + 24/t + 5as/(ht)) (Korthikanti Table 2)."""
    sbh = g["s"] * g["b"] * g["h"]
    per_layer = sbh * (10 + 24 / g["t"] + 5 * g["a"] * g["s"] / (g["h"] * g["t"]))
    return (16 * g["params"] / g["t"] + g["layers"] * per_layer) / 1e9


INDEPENDENT = {
    # Megatron's f and g: 2 all-reduces forward, 2 backward, each of b·s·h 16-bit values
    "05.layer-all-reduces": lambda g: 4 * _ring(g) * g["b"] * g["s"] * g["h"] * 2 / 1e6,
    "05.all-layers-on-a-link": lambda g: 1e3 * 4 * g["layers"] * _ring(g) * g["s"] * g["h"] * 2 / g["beta"],
    "05.tp-memory": _tp_memory,
    # the replicated 10sbh (layernorm and matmul inputs, two 1-byte dropout masks) split t ways
    "05.sp-saving": lambda g: g["layers"] * 10 * g["s"] * g["b"] * g["h"] * (1 - 1 / g["t"]) / 1e9,
    # TP: 4·L·m all-reduces of s·h·2 bytes; DDP: one all-reduce of Ψ·2 bytes; both priced 2(t−1)/t
    "05.tp-vs-ddp": lambda g: 4 * g["layers"] * g["m"] * g["s"] * g["h"] / g["params"],
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("05"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
