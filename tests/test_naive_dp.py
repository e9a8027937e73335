"""Naive single-process DataParallel: the same math as one process, and every byte through device 0 counted.

No process group is needed: naive-dp's N replicas are threads of this process.
"""
import pytest
import torch

from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.data import SyntheticTokens
from partrain_edu.strategies import tensor_bytes
from partrain_edu.strategies.naive_dp import NaiveDataParallel, device0_bytes, in_threads
from partrain_edu.strategies.single import Single
from partrain_edu.train import launch

STEPS = 4
CTX = runtime.ParallelContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo",
                              timeout_s=60.0)


def train(strategy, cfg):
    data = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=cfg.seed)
    losses = []
    for step in range(cfg.steps):
        loss_sum, count = strategy.train_step(*data.global_batch(step, cfg.global_batch))
        losses.append(loss_sum / count)
    return losses, [p.detach().clone() for p in strategy.model.parameters()]


def params_match(ours, reference) -> bool:
    """Final parameters equal up to float32 rounding, as AdamW amplifies it: a key bias has a true gradient of
    0 (softmax ignores a constant shift), so its gradient is pure rounding noise, which Adam divides by its own
    size into steps of up to lr = 3e-3. 1e-4 is far below what training moved the parameters by."""
    return all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(ours, reference, strict=True))


@pytest.fixture(scope="module")
def single():
    return train(Single(CTX, TrainConfig(steps=STEPS)), TrainConfig(steps=STEPS))


@pytest.mark.parametrize("n, microbatches", [(2, 1), (4, 1), (4, 2)])
def test_naive_dp_equals_single_and_counts_device0_bytes(single, n, microbatches):
    cfg = TrainConfig(strategy="naive-dp", nproc=n, steps=STEPS, microbatches=microbatches)
    strategy = NaiveDataParallel(CTX, cfg)
    assert len(strategy.replicas) == n and strategy.replicas[0] is strategy.model
    losses, params = train(strategy, cfg)
    assert losses == pytest.approx(single[0], rel=1e-5, abs=1e-6)
    assert params_match(params, single[1])
    # What went through device 0, step by step, against the formulas of the module docstring.
    psi = tensor_bytes(strategy.model.parameters())
    tokens = cfg.global_batch * cfg.model.seq_len
    expected = device0_bytes(n, psi, input_bytes=tokens * 8, output_bytes=tokens * cfg.model.vocab_size * 4,
                             microbatches=microbatches)
    assert strategy.traffic == [expected] * STEPS
    assert strategy.device0_per_step() == expected
    assert expected["replicate parameters"] == expected["reduce gradients"] == (n - 1) * microbatches * psi


def test_device0_grows_with_n_while_a_ring_rank_stays_below_twice_the_gradients():
    psi = 873_984
    moved = {n: sum(device0_bytes(n, psi, 0, 0).values()) for n in (2, 4, 8)}
    assert moved == {2: 2 * psi, 4: 6 * psi, 8: 14 * psi}        # 2(N−1)·Ψ·4: linear in N
    ring = {n: 2 * 2 * (n - 1) * psi // n for n in (2, 4, 8)}     # sent + received by one DDP rank
    assert all(ring[n] < 4 * psi for n in ring)


def test_train_runs_naive_dp_in_one_process():
    report = launch(TrainConfig(strategy="naive-dp", nproc=4, steps=3))
    assert report["world_size"] == 1 and report["comm"] == {}    # one process: no process-group traffic
    reference = launch(TrainConfig(strategy="single", steps=3))
    assert report["losses"] == pytest.approx(reference["losses"], rel=1e-5)


def test_in_threads_returns_in_order_and_reraises():
    assert in_threads(lambda k: k * k, range(5)) == [0, 1, 4, 9, 16]

    def boom(k):
        if k == 2:
            raise ValueError("replica 2 failed")
        return k

    with pytest.raises(ValueError, match="replica 2 failed"):
        in_threads(boom, range(4))


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="must be divisible by dp × microbatches"):
        launch(TrainConfig(strategy="naive-dp", nproc=3, steps=1))
