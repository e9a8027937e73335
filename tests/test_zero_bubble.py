"""Zero-bubble pipeline parallelism (issue 18; Qi et al. 2024): the executor runs ZB-H1 for real — B the input
gradient, W the weights' later — with the gradients of one process and of 1F1B, on models it never saw; on the
emulated device its measured bubble (气泡) is the simulator's (±0.03, F = B = W as the device charges them), a
third of 1F1B's idle time; `pp-zb1` and PyTorch's `torch-pp-zb` train like `single`. Two launches (4 ranks, the
emulated one: tests/ranks/zero_bubble.py); the refusals and a one-stage attention model run here, in one process.
"""
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import unseen_tp_pp_models as um
from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.launcher import torchrun
from partrain_edu.parallel.pipeline import PipelineExecutor, Stage
from partrain_edu.parallel.pp_comm import Mailbox
from partrain_edu.theory.schedules import build_schedule, simulate
from partrain_edu.train import launch

RANKS = Path(__file__).parent / "ranks" / "zero_bubble.py"
P, M, FP32 = 4, 8, 1e-5


@pytest.fixture(scope="module")
def emulated():
    return torchrun(RANKS, nproc=P, timeout=300, echo=None).published["results"]


def test_zb_h1_runs_its_schedule_with_one_process_gradients(emulated):
    schedule, peaks = build_schedule("zb-h1", P, M), simulate(build_schedule("zb-h1", P, M), 1, 1, 1).peak_activations
    for s, rank in enumerate(emulated):
        zb, base = rank["unseen"]["zb-h1"], rank["unseen"]["1f1b"]
        assert zb["grad_gap"] < FP32, (s, zb["grad_gap"])
        for k, g in zb["grads"].items():                     # the same sums as 1F1B's fused backward
            torch.testing.assert_close(g, base["grads"][k], rtol=FP32, atol=1e-7)
        assert [tuple(a) for a in zb["ran"]] == [(a.kind, a.microbatch) for a in schedule.actions[s]]
        assert zb["peak"] == peaks[s] == P                   # W holds its micro-batch's graph: p in flight
        assert base["peak"] == P - s


def test_emulated_bubble_is_the_simulators_a_third_of_1f1bs_idle(emulated):
    zb = simulate(build_schedule("zb-h1", P, M), 1, 1, 1)   # F = B = W: one forward each, as charged
    base = simulate(build_schedule("1f1b", P, M), 1, 1, 1)  # B + W = 2 forwards together
    assert sum(zb.idle) * 3 == sum(base.idle)
    measured = {name: emulated[0][name]["bubble"]["measured"] for name in ("pp-zb1", "pp-1f1b")}
    print(f"bubble measured / simulated: ZB-H1 {measured['pp-zb1']:.4f} / {zb.bubble_fraction:.4f}, "
          f"1F1B {measured['pp-1f1b']:.4f} / {base.bubble_fraction:.4f}")
    assert abs(measured["pp-zb1"] - zb.bubble_fraction) < 0.03
    assert abs(measured["pp-1f1b"] - base.bubble_fraction) < 0.03
    assert emulated[0]["pp-zb1"]["bubble"]["formula"] == pytest.approx(zb.bubble_fraction)


def test_pp_zb1_and_torch_pp_zb_train_like_single(emulated):
    single = launch(TrainConfig("single", steps=2, microbatches=M))["losses"]
    torch_zb = launch(TrainConfig("torch-pp-zb", nproc=P, steps=2, microbatches=M))["losses"]
    for name, losses in (("pp-zb1", emulated[0]["pp-zb1"]["losses"]), ("torch-pp-zb", torch_zb)):
        assert losses == pytest.approx(single, rel=FP32), (name, losses, single)


class Embed(nn.Module):
    def __init__(self, lm: um.AttentionLM):
        super().__init__()
        self.tok, self.pos = lm.tok, lm.pos

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.size(1)))


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def one_stage(model: nn.Module, pre=None, post=None):
    layers = model.layers if hasattr(model, "layers") else model
    stage = Stage(layers, 0, len(layers), pre, post)
    return stage, PipelineExecutor(build_schedule("zb-h1", 1, 4), [stage], 0, [0], Mailbox([], 4), lm_loss)


def test_the_split_on_an_attention_model_and_its_refusals():
    runtime.init()
    try:  # one stage holding everything: B and W apart must still sum to one backward
        idx = torch.randint(0, um.AttentionLM.VOCAB, (8, um.AttentionLM.SEQ),
                            generator=torch.Generator().manual_seed(0))
        full, lm = um.AttentionLM(), um.AttentionLM()
        lm_loss(full(idx[:, :-1]), idx[:, 1:]).backward()
        stage, executor = one_stage(lm, Embed(lm), nn.Sequential(lm.norm, lm.head))
        executor.step(idx[:, :-1], idx[:, 1:])
        for (name, got), want in zip(lm.named_parameters(), full.parameters(), strict=True):
            torch.testing.assert_close(got.grad, want.grad, rtol=FP32, atol=1e-7, msg=name)
        a, b = nn.Linear(4, 4), nn.Linear(4, 4)
        b.weight = a.weight                                  # tied: W from a's output would miss b's use
        with pytest.raises(ValueError, match="^parameter blocks.0.weight is reached other than through its module"):
            one_stage(nn.Sequential(a, nn.Tanh(), b))[1].step(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
        with pytest.raises(ValueError, match="^B/W split needs each weighted module to return one tensor, once"):
            one_stage(nn.Sequential(a, nn.Tanh(), a))[1].step(torch.randn(4, 4), torch.zeros(4, dtype=torch.long))
    finally:
        runtime.shutdown()
