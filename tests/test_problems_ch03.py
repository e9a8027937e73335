"""Chapter 03's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]
# bytes per parameter: 16-bit weights and gradients + fp32 master, momentum, variance (ZeRO §3.1); fp32: no master
STATE_BYTES = {("mixed", "adam"): 2 + 2 + 12, ("mixed", "sgd"): 2 + 2 + 8, ("fp32", "adam"): 4 + 4 + 8,
               ("fp32", "sgd"): 4 + 4 + 4}


def _layer(g, b, recompute="none"):
    """Korthikanti et al. 2022, Table 2, one device: sbh(34 + 5as/h), selective 34sbh, full 2sbh."""
    sbh = g["s"] * b * g["h"]
    return {"none": sbh * (34 + 5 * g["a"] * g["s"] / g["h"]), "selective": 34 * sbh, "full": 2 * sbh}[recompute]


def _accumulation_steps(g):
    per_sequence = g["layers"] * _layer(g, 1, g["recompute"])
    return min(m for m in range(1, g["B"] + 1)
               if g["B"] % m == 0 and 16 * g["psi"] + g["B"] // m * per_sequence <= 80e9)


INDEPENDENT = {
    "03.model-states": lambda g: STATE_BYTES[g["precision"], g["optimizer"]] * g["psi"] / 1e9,
    "03.activations": lambda g: g["layers"] * _layer(g, g["b"]) / 1e9,
    "03.recompute-saving": lambda g: g["layers"] * (_layer(g, g["b"], g["weak"])
                                                    - _layer(g, g["b"], g["strong"])) / 1e9,
    "03.accumulation-saving": lambda g: (1 - 1 / g["m"]) * g["layers"] * _layer(g, g["B"], g["recompute"]) / 1e9,
    "03.accumulation-steps": _accumulation_steps,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("03"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
