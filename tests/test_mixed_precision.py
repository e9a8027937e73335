"""Mixed precision through the distributed path (parallel/mixed_precision.py, strategies/mixed_precision.py):
bf16 compute and communication, fp32 master weights and AdamW states. One 2-rank launch
(tests/ranks/mixed_precision.py) trains the unseen models under our DDP and ZeRO-3, and the course's
strategies beside their fp32 twins; `single` runs here. Tolerances: bf16 keeps 8 significant bits, one
rounding is ≤ 2⁻⁸ ≈ 0.4 % relative — parameters after 4 AdamW steps within 1e-2 of the fp32 process's,
TinyGPT's losses over 5 steps within 2⁻⁸ of `single`'s (what bf16 can even tell apart)."""
from pathlib import Path

import pytest

import unseen_models as um
from partrain_edu.gaps import pairs_gap
from partrain_edu.launcher import torchrun
from partrain_edu.models import TinyGPT, count_params
from partrain_edu.theory.memory import model_state_bytes
from partrain_edu.theory.traffic import step_traffic
from partrain_edu.train import TrainConfig, launch

RANKS = Path(__file__).parent / "ranks" / "mixed_precision.py"
PARAMS, LOSSES = 1e-2, 2 ** -8
PSI = count_params(TinyGPT())


@pytest.fixture(scope="module")
def published():
    return torchrun(RANKS, nproc=2, timeout=300, echo=None).published


def test_bf16_ddp_and_zero3_match_one_fp32_process_on_unseen_models(published):
    results = published["results"]
    assert sorted(results) == sorted(um.MODELS)
    for name, res in results.items():
        assert res["dtypes"] and res["tied"] and res["state_dict"], (name, res)   # the masters stay as they were
        assert res["copies"] == ["torch.bfloat16"] and res["buckets"] == ["torch.bfloat16"], (name, res)
        # batchnorm: its fc layer feeds a normalisation that removes the mean and the scale, so fc's exact
        # gradient is (nearly) 0; AdamW turns bf16's rounding of it into full-size steps — no tolerance holds.
        if name != "batchnorm":
            assert max(res["single"], res["single_bf16"], res["zero3"]) < PARAMS, (name, res)
    # BatchNorm keeps its parameters in fp32 beside its fp32 running statistics, updated by every forward
    assert results["batchnorm"]["buffers"] == {"dtype": "torch.float32", "moved": True, "batches": [8, 8]}


def test_bf16_ddp_sends_half_the_gradient_bytes(published):
    results = published["results"]
    for name in ("frozen", "tied", "batchnorm", "uneven"):          # all-fp32 models: every byte halves
        sent = results[name]["sent"]
        assert sent["bf16"]["all_reduce"]["bytes"] * 2 == sent["fp32"]["all_reduce"]["bytes"], (name, sent)
    # find_unused_parameters: one int32 used-flag per parameter is all-reduced too, in both runs (6 params × 4 B)
    sent, flags = results["branch"]["sent"], 4 * 6 * 4
    assert (sent["bf16"]["all_reduce"]["bytes"] - flags) * 2 == sent["fp32"]["all_reduce"]["bytes"] - flags


def test_bf16_strategies_reproduce_single_with_half_the_bytes(published):
    reports = published["reports"]
    single = launch(TrainConfig(strategy="single", steps=5), on_step=lambda step, loss: None)
    for name in ("ddp-bf16", "zero3-bf16", "torch-fsdp-bf16"):
        fp32, bf16 = reports[name[:-5]], reports[name]
        assert pairs_gap(bf16["losses"], single["losses"]) < LOSSES, (name, bf16["losses"], single["losses"])
        assert pairs_gap(fp32["losses"], single["losses"]) < 1e-5, name
        for op, counted in fp32["comm"].items():               # every collective, half the bytes
            assert bf16["comm"][op]["bytes"] * 2 == counted["bytes"], (name, op, bf16["comm"], fp32["comm"])
    # and what the formula says for 2-byte elements (theory.traffic)
    for name, strategy in (("ddp-bf16", "ddp"), ("zero3-bf16", "zero3")):
        theory = step_traffic(strategy, PSI, dp=2, bytes_per_element=2)
        assert sum(v["bytes"] for v in reports[name]["comm"].values()) == theory.per_rank_bytes_sent, name


def test_model_state_bytes_per_parameter(published):
    reports = published["reports"]
    steps = 4 * len(list(TinyGPT().parameters()))                # AdamW's `step`, one 4-byte tensor each
    ddp = reports["ddp-bf16"]["state_bytes"]
    weights, grads, optimizer = model_state_bytes(PSI, precision="mixed")          # ZeRO's 2 + 2 + 12
    assert (ddp["params"], ddp["grads"], ddp["optimizer"] - steps) == (weights, grads + 4 * PSI, optimizer)
    shard = -(-PSI // 2)
    for name in ("zero3-bf16", "torch-fsdp-bf16"):              # FSDP's arrangement: 4 + 4 + 8 per parameter, / n
        held = reports[name]["state_bytes"]
        assert held["params"] == held["grads"] == 4 * shard and held["optimizer"] - steps == 8 * shard, (name, held)
