"""Chapter 02's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def _ring_all_reduce(nbytes, n):
    return 2 * (n - 1) / n * nbytes


def _bucket_overlap(g):
    comm = _ring_all_reduce(2 * g["psi"], g["n"]) / g["beta"]     # one all-reduce of the bf16 gradients
    return 1e3 * (1 - 1 / g["k"]) * min(g["B"], comm)            # Li et al. 2020 §3.2.3: the shorter, less 1/k


INDEPENDENT = {
    "02.ddp-bytes": lambda g: _ring_all_reduce(g["psi"] * g["b"], g["n"]) / 1e9,
    "02.no-sync": lambda g: (g["M"] - 1) * _ring_all_reduce(2 * g["psi"], g["n"]) / 1e9,
    "02.link-time": lambda g: 1e3 * _ring_all_reduce(2 * g["psi"], g["n"]) / g["beta"],
    "02.bucket-overlap": _bucket_overlap,
    "02.per-tensor-latency": lambda g: 1e3 * (g["T"] - 1) * 2 * (g["n"] - 1) * g["alpha"],
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("02"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
