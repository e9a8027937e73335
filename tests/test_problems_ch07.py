"""Chapter 07's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def _dp_bytes(g):
    """One ring all-reduce of the 16-bit gradients of a rank's Ψ/(tp·pp) parameters over dp ranks."""
    return 2 * (g["dp"] - 1) / g["dp"] * 2 * g["params"] / (g["tp"] * g["pp"])


def _states(g):
    """ZeRO-1 on a model-parallel shard Ψ' = Ψ/(tp·pp): 2Ψ' weights + 2Ψ' gradients + 12Ψ'/dp optimizer."""
    shard = g["params"] / (g["tp"] * g["pp"])
    return (4 * shard + 12 * shard / g["dp"]) / 1e9


def _bubble(g):
    m = g["batch"] / (g["dp"] * g["b"])
    return 100 * (g["pp"] - 1) / (m + g["pp"] - 1)


def _tp_saved(g):
    sent = 4 * g["layers"] / g["pp"] * g["m"] * 2 * (g["tp"] - 1) / g["tp"] * g["s"] * g["h"] * 2
    return sent / 50e9 - sent / 450e9


def _order(g):
    """With tp·dp = tp·pp = 8 GPUs per node: pp outermost keeps dp in a node and sends every pipeline message
    across; dp outermost keeps pp in a node and puts every dp ring member on its own node."""
    assert g["tp"] * g["dp"] == 8 and g["tp"] * g["pp"] == 8
    sends = 2 * g["m"] if g["pp"] >= 3 else g["m"]          # a middle stage sends both ways
    boundary = sends * g["b"] * g["s"] * g["h"] * 2
    return _dp_bytes(g) / boundary


INDEPENDENT = {
    "07.dp-shard-bytes": lambda g: _dp_bytes(g) / 1e9,
    "07.model-states-3d": _states,
    "07.bubble-at-a-batch": _bubble,
    "07.tp-on-nvlink": _tp_saved,
    "07.order-across-nodes": _order,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("07"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
