"""Chapter 04's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def _states(psi, n, k):
    """ZeRO §5 per GPU, mixed precision + Adam: 2Ψ weights, 2Ψ gradients, 12Ψ optimizer; each sharded from its
    stage on, a shard padded to ⌈Ψ/N⌉ parameters."""
    shard = math.ceil(psi / n)
    return 2 * (shard if k >= 3 else psi) + 2 * (shard if k >= 2 else psi) + 12 * (shard if k >= 1 else psi)


def _fit_micro_batch(g):
    per_layer = {"selective": 34, "full": 2}[g["recompute"]] * g["s"] * g["h"]   # Korthikanti Table 2, b = 1
    return (80e9 - _states(g["psi"], g["N"], g["k"])) // (g["layers"] * per_layer)


def _fewest_gpus(g):
    return min(n for n in range(1, 4097) if _states(g["psi"], n, g["k"]) <= 80e9 - g["R"])


INDEPENDENT = {
    "04.stage-bytes": lambda g: _states(g["psi"], g["N"], g["k"]) / 1e9,
    "04.stage-saving": lambda g: (_states(g["psi"], g["N"], g["low"]) - _states(g["psi"], g["N"], g["high"])) / 1e9,
    "04.zero3-traffic": lambda g: (2 * g["m"] - 1) * (g["N"] - 1) / g["N"] * 2 * g["psi"] / 1e9,
    "04.fit-micro-batch": _fit_micro_batch,
    "04.fewest-gpus": _fewest_gpus,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("04"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
