"""The emulated device turns a 2-core laptop's seconds into a cluster's: measured on its clock, the pipeline
bubbles, a straggler's cost, DDP's overlap and the network's price equal what the formulas and the simulator
say (one 4-rank launch, tests/ranks/emulated.py). The clock does not depend on the machine's load: the
tolerances are the issue's (±0.03, ±10 %, ±15 %), and the results land far inside them. tp, cp and fsdp-tp
(`train.launch`, one step each) take the calibrated model's seconds: its layer compute, its tp and cp terms
(`step_time.layer_times`) and their collectives on `theory.network`'s links (`link_cost` for a node's pair), each
±0.1 % (what the predictions leave out is named in each test: tens of microseconds of a step of about 0.4–0.8 s).
"""
from dataclasses import astuple
from pathlib import Path

import pytest

from partrain_edu import emulated
from partrain_edu.config import TrainConfig
from partrain_edu.launcher import torchrun
from partrain_edu.theory.calibration import terms
from partrain_edu.theory.hardware import DEVICES, GPT_1_3B, device_named, layer_forward_flops, layer_seconds
from partrain_edu.theory.layout import Layout
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.network import group_link
from partrain_edu.theory.step_time import layer_forward_seconds, layer_times, link_cost
from partrain_edu.theory.traffic import bucketed_backward_end, collective_time, fit_alpha_beta, link_time, ring_steps
from partrain_edu.train import launch

RANKS = Path(__file__).parent / "ranks" / "emulated.py"


@pytest.fixture(scope="module")
def measured():
    return torchrun(RANKS, nproc=4, timeout=300, echo=None).published["results"]


def test_measured_bubbles_are_the_formulas(measured):
    assert abs(measured["gpipe"]["bubble"] - 3 / 11) < 0.03       # (p−1)/(m+p−1), p = 4, m = 8
    assert abs(measured["1f1b"]["bubble"] - 3 / 11) < 0.03        # 1F1B saves memory, not bubble
    assert abs(measured["interleaved"]["bubble"] - 3 / 19) < 0.03  # (p−1)/(v·m+p−1), v = 2


def test_a_straggler_slows_the_step_as_simulated(measured):
    ratio = measured["slow_last"]["makespan"] / measured["1f1b"]["makespan"]
    assert measured["slow_last"]["simulated_ratio"] == pytest.approx(15 / 11)   # 1.36×
    assert ratio == pytest.approx(measured["slow_last"]["simulated_ratio"], rel=0.10)


def test_ddp_overlap_saves_what_the_model_says(measured):
    ddp = measured["ddp"]
    assert ddp["buckets"] == [4, 1]
    saving, model = ddp["single"] - ddp["bucketed"], ddp["model_single"] - ddp["model_bucketed"]
    assert model > 0.2 * ddp["model_single"]                    # a saving worth teaching, not rounding
    assert saving == pytest.approx(model, rel=0.15)


def test_ddp_timeline_records_when_each_bucket_finished(measured):
    # The first bucket (the last layer's gradients, ready after one layer's backward of 2·T) finishes one
    # all-reduce later, while backward still runs: the overlap picture must not stamp it at the end of backward.
    timeline, per_layer = measured["ddp"]["timeline"], measured["ddp"]["per_layer"]
    assert timeline["finished"][0] == pytest.approx(2 * 0.01 + per_layer, rel=0.1)
    assert timeline["finished"][0] < timeline["compute_end"]


def test_one_gigabit_ethernet_costs_what_link_time_says(measured):
    links = measured["links"]
    assert links["1gbe"] / links["infiniband"] == pytest.approx(links["model_1gbe"] / links["model_infiniband"],
                                                                 rel=0.15)
    assert links["1gbe"] > 5 * links["infiniband"]


def test_the_charged_time_dominates_the_real_arithmetic(measured):
    assert measured["report"]["dominance"] >= 10


def test_bad_specs_are_one_line_errors():
    for spec, words in [("emulated:tpu", "unknown device 'tpu'"), ("gpu", "device must be 'cpu' or"),
                        ("emulated:a100,net=wifi", "bad emulated-device option 'net=wifi'"),
                        ("emulated:a100,scale=0", "scale and slow factors positive"),
                        ("emulated:a100,slow=3", "bad emulated-device option 'slow=3'")]:
        with pytest.raises(ValueError, match=words):
            emulated.parse(spec)
    em = emulated.parse("emulated:h100,node=2,net=1gbe,scale=40,slow=3:1.5", rank=3)
    assert (em.node, em.net, em.scale, em.compute_factor) == (2, "1gbe", 40.0, 1.5)
    assert em.link_of((0, 1))[0] == "nvlink" and em.link_of((1, 2))[0] == "1gbe"
    # the calibrated model's links (`theory.network`): NVLink inside a node; across nodes a group's k members on
    # a node share its k NICs, so a 4-rank ring with 2 per node gets twice a cross-node pair's β (same α)
    assert em.link_of((0, 1))[1:] == link_cost("h100-sxm", inside_node=True)
    two = emulated.parse("emulated:h100,node=2")
    assert two.link_of((1, 2))[1:] == link_cost("h100-sxm", inside_node=False)
    pair, four = two.link_of((1, 2)), two.link_of((0, 1, 2, 3))
    assert four[0] == "infiniband" and four[1] == pair[1] and four[2] == pytest.approx(2 * pair[2])
    assert four[1:] == astuple(group_link(device_named("h100-sxm"), 4, 2))[:2]
    # 8 per node: the node's 8 NICs outrun NVLink at NCCL's efficiency, so the ring is NVLink-bound
    eight = emulated.parse("emulated:h100,node=8").link_of(tuple(range(16)))
    h100 = device_named("h100-sxm")
    assert eight[2] == pytest.approx(min(h100.nvlink * 0.82, 8 * h100.nic * 0.96))


def test_the_latency_term():
    assert ring_steps("all_reduce", 8) == 14 and ring_steps("send", 2) == 1 and ring_steps("all_gather", 1) == 0
    assert link_time(10**9, "1gbe") == 8.0 and link_time(10**9, "1gbe", messages=2) == pytest.approx(8.0001)
    alpha, beta = 1e-3, 1e6
    assert collective_time("all_reduce", 8000, 4, alpha=alpha, beta=beta) == pytest.approx(6e-3 + 12000 / beta)
    # k equal buckets: max(B + C/k, B/k + C), so overlap saves (1 − 1/k)·min(B, C)
    assert bucketed_backward_end(4.0, [1.0] * 4) == 5.0 and bucketed_backward_end(4.0, [4.0]) == 8.0
    assert bucketed_backward_end(1.0, [2.0, 2.0]) == 4.5


def test_a_layer_costs_the_papers_flops():
    # GPT-3 XL, one 2048-token sequence: 24·s·h² + 4·s²·h = 240.5 GFLOP, 0.77 ms on an A100's 312 TFLOP/s
    assert layer_forward_flops(GPT_1_3B, 1) == 24 * 2048 ** 3 + 4 * 2048 ** 3
    assert layer_seconds(GPT_1_3B, 1, DEVICES["a100"]) == pytest.approx(7.71e-4, rel=1e-3)


def test_alpha_and_beta_are_recovered_from_timed_collectives():
    alpha, beta = 2e-4, 1e9
    samples = [("all_reduce", size, n, collective_time("all_reduce", size, n, alpha=alpha, beta=beta))
               for size in (64, 10**6, 10**7) for n in (2, 4)]
    fit = fit_alpha_beta(samples)
    assert fit[0] == pytest.approx(alpha) and fit[1] == pytest.approx(beta) and fit[2] < 1e-9
    with pytest.raises(ValueError, match="vary both the message size and the group size"):
        fit_alpha_beta([("all_reduce", 1000, 2, 1.0), ("all_reduce", 1000, 2, 1.0)])


def test_a_torchrun_cell_picks_its_device_from_the_magic_line():
    from partrain_edu.notebook.magics import MagicUsageError, run_cell_magic

    ns: dict = {}
    cell = ("from partrain_edu import runtime\nctx = runtime.init()\n"
            "runtime.publish('device', ctx.emulator.device.name if ctx.emulator else 'cpu')\n")
    run_cell_magic("-n 2 --device emulated:h100,node=1", cell, ns)
    assert ns["device"] == "H100 SXM 80GB"
    with pytest.raises(MagicUsageError, match="unknown device 'tpu'"):
        run_cell_magic("-n 2 --device emulated:tpu", cell, ns)


# -- tp, cp and fsdp-tp: GPT-3 XL's seconds from the calibrated model (global batch 16, one micro-batch) --------
XL, A100 = MODELS["gpt-1.3b"], "a100-80gb"
NVLINK = dict(zip(("alpha", "beta"), link_cost(A100, inside_node=True), strict=True))


def emulated_step(strategy: str, nproc: int, **sizes) -> float:
    cfg = TrainConfig(strategy=strategy, nproc=nproc, steps=1, device="emulated:a100,scale=0.05", **sizes)
    return launch(cfg, on_step=lambda step, loss: None, timeout=240)["step_time_s"]


def layers(samples: int, tp: int = 1, cp: int = 1) -> float:
    """24 layers' forward + backward (3×) and their tp and cp communication, as `step_time` prices them."""
    terms_ = layer_times(XL, Layout(tp=tp, cp=cp, micro_batch=samples), device_named(A100), terms(A100))
    forward = layer_forward_seconds(XL, A100, samples, tp=tp, cp=cp)
    assert forward == terms_["forward"]
    return XL.layers * (3 * forward + terms_["tp"] + terms_["cp"])


def activations_all_reduce(samples: int, tp: int) -> float:
    """The embedding's g (forward) or the head's f (backward): one b·s·h bf16 all-reduce, outside the layers."""
    return collective_time("all_reduce", 2 * samples * XL.seq * XL.hidden, tp, **NVLINK)


def test_tp_takes_the_calibrated_layers_and_their_all_reduces():
    # left out: the vocab-parallel loss's 3 all-reduces of b·s values (≈ 40 µs)
    predicted = layers(16, tp=2) + 2 * activations_all_reduce(16, 2)
    assert emulated_step("tp", 2, tp=2) == pytest.approx(predicted, rel=1e-3)


def test_cp_takes_the_calibrated_layers_their_kv_ring_and_the_gradient_all_reduce():
    # the ring passes K, V forward, K, V and dK, dV backward: all-gather, all-gather, reduce-scatter's bytes;
    # DDP's one bucket (TinyGPT's gradients, as GPT-3 XL's bf16 ones) leaves after backward
    predicted = layers(16, cp=2) + collective_time("all_reduce", 2 * XL.params(), 2, **NVLINK)
    assert emulated_step("cp", 2, cp=2) == pytest.approx(predicted, rel=1e-3)


def test_fsdp_tp_adds_each_slices_gathers_and_reduce_scatter_to_tp():
    # dp 2 × tp 2 (4 ranks: the smallest 2D layout); our FSDP without prefetch: every collective exposed.
    # Left out: the loss's all-reduces and the α of 5 units' collectives instead of 3 whole ones (≈ 80 µs)
    slice_bytes = 2 * XL.params() / 2
    fsdp = (2 * collective_time("all_gather", slice_bytes, 2, **NVLINK)
            + collective_time("reduce_scatter", slice_bytes, 2, **NVLINK))
    predicted = layers(8, tp=2) + 2 * activations_all_reduce(8, 2) + fsdp
    assert emulated_step("fsdp-tp", 4, dp=2, tp=2) == pytest.approx(predicted, rel=1e-3)
