"""Chapter 11's problem keys against an independent computation from the given numbers, for several seeds."""
import math

import pytest

from partrain_edu.problems.bank import draw, of_chapter

SEEDS = [1, 2, 3, 17, 2026]


def beta(g, k):
    """A ring across nodes with k members on each: min(NVLink · η_NVLink, k · NIC · η_net), one NIC's for k = 1
    (NCCL runs one channel per NIC; Austin et al. 2025: "B / W_node egress")."""
    egress = k * g["nic"] * g["eta_net"]
    return egress if k == 1 else min(g["nvlink"] * g["eta_nvlink"], egress)


def tokens_per_gpu(g):
    """(e/2) · F / (tp · β): the replica's FLOPs 6Ψt over its 3Ψe bytes reach F/β, t split over tp GPUs."""
    return g["e"] / 2 * g["flops"] / (g["tp"] * beta(g, g["node"] // g["tp"]))


def intensity_margin(g):
    """6(Ψ/tp)t FLOPs over 3(n−1)/n · (Ψ/tp) · e bytes, against F/β."""
    n = g["gpus"] // g["tp"]
    t = g["batch"] * g["seq"] / n
    intensity = 2 * t * n / ((n - 1) * g["e"])
    return intensity / (g["flops"] / beta(g, g["node"] // g["tp"]))


def latency_tp(g):
    """Hockney's α–β ring all-gather, (n−1)·α + (n−1)/n · S / β, FSDP alone over G against tp's slice over G/tp."""
    def gather(size, n, k):
        return (n - 1) * g["alpha"] + (n - 1) / n * size / beta(g, k)

    tp = g["tp"]
    return gather(g["S"], g["gpus"], g["node"]) / gather(g["S"] / tp, g["gpus"] // tp, g["node"] // tp)


def batch_floor(g):
    """The smallest tp of a node (1, 2, 4, 8) with G / tp ≤ ⌊B / b_min⌋ replicas."""
    return next(tp for tp in (1, 2, 4, 8) if g["gpus"] // tp <= g["batch"] // g["least"])


INDEPENDENT = {
    "11.dp-beta": lambda g: beta(g, g["node"] // g["tp"]) / 1e9,
    "11.tokens-per-gpu": tokens_per_gpu,
    "11.intensity-margin": intensity_margin,
    "11.latency-tp": latency_tp,
    "11.batch-floor": batch_floor,
}


def test_every_problem_of_the_chapter_has_an_independent_key():
    assert sorted(INDEPENDENT) == sorted(p.id for p in of_chapter("11"))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("pid", sorted(INDEPENDENT))
def test_the_key_equals_the_independent_computation(pid, seed):
    drawn = draw(pid, seed)
    assert math.isclose(drawn.answer, INDEPENDENT[pid](drawn.given), rel_tol=1e-6)
