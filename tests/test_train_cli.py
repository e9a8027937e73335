"""`partrain-edu train`: the contract of docs/cli.md, and the oracle — every strategy reproduces `single`."""
import json
import subprocess
import sys
import time

import pytest

from partrain_edu.models import TinyGPT
from partrain_edu.theory.hardware import DEVICES, GPT_1_3B, layer_seconds
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.step_time import layer_forward_seconds

FP32 = 4


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "partrain_edu", *args], capture_output=True, text=True,
                          timeout=timeout)


def train_json(*args: str) -> dict:
    done = cli("train", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # exactly one JSON object on stdout


@pytest.fixture(scope="module")
def single():
    return train_json("--strategy", "single", "--steps", "20")


def model_bytes():
    params = list(TinyGPT().parameters())
    n = sum(p.numel() for p in params)
    # AdamW keeps exp_avg and exp_avg_sq per parameter, plus a scalar fp32 step count per tensor.
    return n * FP32, n * FP32, 2 * n * FP32 + len(params) * FP32


def test_single_learns_and_reports_the_contract(single):
    assert set(single) == {"strategy", "world_size", "losses", "comm", "state_bytes", "step_time_s"}
    losses = single["losses"]
    assert single["strategy"] == "single" and single["world_size"] == 1 and len(losses) == 20
    assert abs(losses[0] - 4.852) < 0.05  # ln(128): an untrained model guesses
    assert losses[-1] < losses[0] - 1.0 and losses[-1] < min(losses[:10])
    assert single["comm"] == {}
    params, grads, optimizer = model_bytes()
    assert single["state_bytes"] == {"params": params, "grads": grads, "optimizer": optimizer}
    assert single["step_time_s"] > 0


@pytest.mark.parametrize("nproc, microbatches", [(4, 2)])
def test_torch_ddp_reproduces_single_and_sends_the_ring_all_reduce(single, nproc, microbatches):
    ddp = train_json("--strategy", "torch-ddp", "--nproc", str(nproc), "--steps", "20",
                     "--microbatches", str(microbatches))
    assert ddp["world_size"] == nproc
    assert ddp["losses"] == pytest.approx(single["losses"], rel=1e-5, abs=1e-5)
    params, grads, optimizer = model_bytes()
    # Ring all-reduce: each rank sends 2(n−1)/n of the gradient bytes per step (DDP's one bucket here).
    assert ddp["comm"] == {"all_reduce": {"calls": 1, "bytes": 2 * (nproc - 1) * grads // nproc}}
    assert ddp["state_bytes"] == {"params": params, "grads": grads, "optimizer": optimizer}  # a full replica


def test_gradient_accumulation_in_single_matches_one_big_batch(single):
    accumulated = train_json("--strategy", "single", "--steps", "20", "--microbatches", "4")
    assert accumulated["losses"] == pytest.approx(single["losses"], rel=1e-5, abs=1e-5)


def test_people_get_a_table():
    done = cli("train", "--strategy", "single", "--steps", "3")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("single on 1 rank(s)\nstep  loss\n   1  4.88")
    assert "median step time" in done.stdout


@pytest.mark.parametrize("args, words", [
    (["--strategy", "nope"], "unknown strategy 'nope'; choose one of: single, torch-ddp"),
    (["--strategy", "single", "--steps", "0"], "--steps must be a positive integer"),
    (["--strategy", "single", "--nproc", "2"], "single runs on one process"),
    (["--strategy", "torch-ddp", "--nproc", "3"], "--global-batch 16 must be divisible by dp × microbatches"),
    (["--strategy", "torch-ddp", "--nproc", "2", "--tp", "2"], "data parallel only"),
    (["--strategy", "single", "--global-batch", "-4"], "--global-batch must be a positive integer"),
    (["--strategy", "single", "--steps", "ten"], "invalid int value: 'ten'"),
    (["--strategy", "single", "--timeout", "-1"], "--timeout must be a positive, finite number of seconds"),
    (["--strategy", "torch-ddp", "--nproc", "2", "--timeout", "nan"], "--timeout must be a positive, finite"),
])
def test_bad_input_exits_2_with_one_line(args, words):
    done = cli("train", *args, "--json")
    assert done.returncode == 2
    assert done.stdout == ""
    assert words in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_timeout_stops_an_in_process_strategy_too():
    """`single` runs in the caller's process: the limit still holds, and says how to raise it."""
    start = time.perf_counter()
    done = cli("train", "--strategy", "single", "--steps", "100000", "--timeout", "3", "--json")
    assert done.returncode == 1 and "timed out after 3 s" in done.stderr and "--timeout" in done.stderr
    assert time.perf_counter() - start < 30


def test_a_pipeline_on_the_emulated_device_reports_its_bubble_beside_the_formula(single):
    report = train_json("--strategy", "pp-1f1b", "--nproc", "4", "--pp", "4", "--microbatches", "8", "--steps", "3",
                        "--device", "emulated:a100")
    bubble = report["emulated"]["bubble"]
    assert bubble["formula"] == pytest.approx(3 / 11) and bubble["formula_text"].startswith("(p−1)/(m+p−1)")
    assert abs(bubble["measured"] - bubble["formula"]) < 0.03       # messages cost a little on top
    assert report["emulated"]["dominance"] >= 10
    # time shaped, not math: the 3 steps equal the first 3 of single's 20
    assert max(abs(a - b) for a, b in zip(report["losses"], single["losses"][:3], strict=True)) < 1e-5
    # (m + p − 1) · 3 · a stage of 24/4 GPT-3 XL layers over 2 sequences on an A100, at the calibrated model's
    # seconds per layer: the emulated step time (the rest: the boundary activations' sends)
    layer = layer_forward_seconds(MODELS["gpt-1.3b"], "a100", 2)
    assert report["step_time_s"] == pytest.approx(11 * 3 * 6 * layer, rel=0.08)
    # MFU: the layers reach a fraction of peak (their FLOPs at peak / their calibrated seconds), and a pipeline
    # loses its bubble on top
    at_peak = layer_seconds(GPT_1_3B, 2, DEVICES["a100"]) / layer
    assert report["emulated"]["mfu"] == pytest.approx(at_peak * (1 - bubble["measured"]), rel=0.05)


def test_a_strategy_the_emulator_cannot_time_is_refused_before_it_starts():
    done = cli("train", "--strategy", "torch-ddp", "--nproc", "2", "--device", "emulated:a100", timeout=60)
    assert done.returncode == 2 and "torch-ddp cannot be timed on the emulated device" in done.stderr
    assert "Traceback" not in done.stderr


def test_launch_all_gives_each_config_the_report_launch_gives_it():
    from partrain_edu.config import TrainConfig
    from partrain_edu.train import launch, launch_all

    # the runs after the first are the ones an earlier run could leak into: each is held against launch(cfg)
    cfgs = [TrainConfig("zero3", nproc=2, steps=3), TrainConfig("ddp", nproc=2, steps=3, device="emulated:a100"),
            TrainConfig("pp-1f1b", nproc=2, pp=2, microbatches=4, steps=3, device="emulated:a100")]
    together, apart = launch_all(cfgs)[1:], [launch(cfg) for cfg in cfgs[1:]]
    for one, alone in zip(together, apart, strict=True):
        assert (one["strategy"], one["losses"], one["comm"], one["state_bytes"]) == \
            (alone["strategy"], alone["losses"], alone["comm"], alone["state_bytes"])
        # the emulated device's clock starts afresh for each run, after a CPU run and after an emulated one
        assert one["step_time_s"] == pytest.approx(alone["step_time_s"], rel=1e-3)
        assert one["emulated"]["compute_s"] == pytest.approx(alone["emulated"]["compute_s"], rel=1e-9)
    with pytest.raises(ValueError, match="one world size above 1"):
        launch_all([cfgs[1], TrainConfig("ddp", nproc=4)])
