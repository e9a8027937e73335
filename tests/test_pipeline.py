"""Pipeline parallelism (issue 8): `pp-naive`, `pp-gpipe`, `pp-1f1b`, `pp-interleaved` and `torch-pp` against
`single`; the executor's real order of work and its stashed activations against `theory.schedules`; its
traffic against `theory.traffic`'s boundary-activation model; bad input refused before anything runs.

One launch per pipeline size runs every check on its ranks and publishes the numbers; the tests assert.
Timings are printed (measured bubble beside the formula), never asserted.
"""
import pytest

from partrain_edu.config import TrainConfig
from partrain_edu.launcher import TorchrunError, torchrun
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.strategies import get_strategy
from partrain_edu.strategies.pipeline import split_tinygpt
from partrain_edu.theory.schedules import build_schedule, simulate
from partrain_edu.theory.traffic import step_traffic
from partrain_edu.train import launch
from partrain_edu.viz.pipeline import inflight_curves, pipeline_figure

STEPS, GLOBAL_BATCH, T, H, FP32 = 3, 16, 32, 64, 4

RANK_SCRIPT = r'''
import sys
from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.strategies.pipeline import profile_step
from partrain_edu.train import run

m, steps, runs, profiled = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(","), sys.argv[4].split(",")
ctx = runtime.init()
out = {}
for name in runs:
    report = run(ctx, TrainConfig(name, nproc=ctx.world_size, steps=steps, microbatches=m))
    out[name] = {"losses": report["losses"], "comm": report["comm"]}
for name in profiled:
    out[name]["profile"] = profile_step(ctx, TrainConfig(name, nproc=ctx.world_size, microbatches=m))
runtime.publish("pipeline", out)
runtime.shutdown()
'''

LAUNCHES = {  # p: (m, strategies trained and compared, schedules whose executor is profiled)
    2: (4, ["pp-naive", "pp-gpipe", "pp-1f1b", "pp-interleaved", "torch-pp"],
        ["pp-gpipe", "pp-1f1b", "pp-interleaved"]),
    4: (8, ["pp-gpipe", "pp-1f1b", "torch-pp"], ["pp-gpipe", "pp-1f1b"]),
}
SCHEDULE = {"pp-naive": ("naive", 1), "pp-gpipe": ("gpipe", 1), "pp-1f1b": ("1f1b", 1),
            "pp-interleaved": ("interleaved", 2)}  # strategy → (schedule, chunks per rank)


@pytest.fixture(scope="module", params=sorted(LAUNCHES))
def pipeline_run(request):
    p = request.param
    m, runs, profiled = LAUNCHES[p]
    result = torchrun(RANK_SCRIPT, nproc=p, args=[str(m), str(STEPS), ",".join(runs), ",".join(profiled)],
                      echo=None, timeout=300)
    single = launch(TrainConfig("single", steps=STEPS, microbatches=m))["losses"]
    return p, m, result.published["pipeline"], single


def test_losses_equal_single(pipeline_run):
    p, m, out, single = pipeline_run
    for name, got in out.items():
        worst = max(abs(a - b) / b for a, b in zip(got["losses"], single, strict=True))
        print(f"p={p} m={m} {name}: worst relative loss gap to single {worst:.2e}")
        assert worst < 1e-5, (name, got["losses"], single)


def test_executor_runs_the_schedule_and_holds_its_activations(pipeline_run):
    p, m, out, _ = pipeline_run
    for name, got in out.items():
        if "profile" not in got:
            continue
        prof = got["profile"]
        schedule = build_schedule(SCHEDULE[name][0], p, m, SCHEDULE[name][1])
        sim = simulate(schedule)
        for s in range(p):  # the real order of work on each rank is the schedule's list for that stage
            ran = [(e["kind"], e["microbatch"], e["chunk"]) for e in prof["events"] if e["stage"] == s]
            assert ran == [(a.kind, a.microbatch, a.chunk) for a in schedule.actions[s]], (name, s)
        assert prof["peaks"] == list(sim.peak_activations), (name, prof["peaks"], sim.peak_activations)
        drawn = [max(h for _, h in curve) for curve in inflight_curves(
            [(e["stage"], e["microbatch"], e["chunk"], e["kind"], e["start"], e["end"]) for e in prof["events"]], p)]
        assert drawn == prof["peaks"]  # the figure's activation strip shows what the executor stashed
        if name == "pp-gpipe":
            assert prof["peaks"] == [m] * p
        if name == "pp-1f1b":
            assert prof["peaks"] == [p - s for s in range(p)]
        ran = {(e["kind"], e["microbatch"], e["chunk"] * p + e["stage"]): e for e in prof["events"]}
        for (kind, mb, v), e in ran.items():  # causality on the shared clock: each waited for its message
            if kind == "F" and v > 0:
                assert e["start"] >= ran["F", mb, v - 1]["end"]
            if kind == "B" and v < schedule.chunks * p - 1:
                assert e["start"] >= ran["B", mb, v + 1]["end"]
        print(f"p={p} m={m} {name}: measured bubble {prof['bubble']:.3f}, simulated {sim.bubble_fraction:.3f}, "
              f"(p-1)/(m+p-1) = {(p - 1) / (m + p - 1):.3f}; peaks {prof['peaks']}")
        pipeline_figure(prof["events"], stages=p, time_label="seconds")  # the real timeline draws


def test_traffic_equals_the_boundary_activation_model(pipeline_run):
    p, m, out, _ = pipeline_run
    activation = GLOBAL_BATCH // m * T * H * FP32  # one (B/m, T, H) fp32 message
    model = step_traffic("pp", pp=p, hidden=H, seq=T, micro_batch=GLOBAL_BATCH // m, microbatches=m,
                         bytes_per_element=FP32).per_rank_bytes_sent
    for name in ("pp-gpipe", "pp-1f1b", "torch-pp"):
        comm = out[name]["comm"]
        assert comm["isend"]["bytes"] == model, (name, comm)
        print(f"p={p} {name}: comm {comm}; model {model}")
    if "pp-naive" in out:  # one whole-batch message each way; the busiest rank sends one
        assert out["pp-naive"]["comm"]["isend"]["bytes"] == GLOBAL_BATCH * T * H * FP32
    if "pp-interleaved" in out:  # virtual stages v = c·p + s: rank s sends F from each v < pv−1, B from each v > 0
        v_total = 2 * p
        sends = [sum((v < v_total - 1) + (v > 0) for v in range(s, v_total, p)) for s in range(p)]
        assert out["pp-interleaved"]["comm"]["isend"]["bytes"] == max(sends) * m * activation


@pytest.mark.parametrize("strategy, nproc, m, fix", [
    ("pp-interleaved", 2, 3, "multiple of 2"),
    ("pp-interleaved", 4, 4, "--pp 2 or less"),
    ("pp-1f1b", 8, 8, "--pp 4 or less"),
    ("pp-gpipe", 2, 5, "divisible by --microbatches 5"),
    ("torch-pp", 8, 8, "--pp 4 or less"),
])
def test_bad_input_is_refused_before_anything_runs(strategy, nproc, m, fix):
    with pytest.raises(ValueError, match="^[^\n]*" + fix.replace("-", r"\-").replace(".", r"\.")):
        launch(TrainConfig(strategy, nproc=nproc, microbatches=m, steps=1))


def test_pipeline_layout_and_split():
    with pytest.raises(ValueError, match="--pp equal to --nproc"):
        get_strategy("pp-1f1b").layout(TrainConfig("pp-1f1b", nproc=2, pp=2, dp=2))
    model = TinyGPT(GPTConfig())
    assert split_tinygpt(model, 2) == [(0, 2), (2, 4)]   # balanced by parameter count
    assert split_tinygpt(model, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert split_tinygpt(model, 2, boundaries=[1]) == [(0, 1), (1, 4)]
    with pytest.raises(ValueError, match="boundaries must be 1 increasing"):
        split_tinygpt(model, 2, boundaries=[4])
    with pytest.raises(ValueError, match="at most 4 stages"):
        split_tinygpt(model, 5)


def test_stages_must_agree_on_shapes():
    import torch

    from partrain_edu import runtime
    from partrain_edu.parallel.pp_comm import Boundary, Mailbox, agree_on_shapes

    with pytest.raises(ValueError, match="does not match the agreed"):  # checked before anything is sent
        Mailbox([Boundary((2, T, H))], microbatches=8).send(torch.zeros(4, T, H), 1, "F", 0, 1)
    runtime.init()
    try:
        with pytest.raises(ValueError, match="do not join up"):
            agree_on_shapes({"shape": (2, T, H), "layers": [(0, 1), (2, 4)]})
        assert agree_on_shapes({"shape": (2, T, H), "layers": [(0, 2), (2, 4)]})[0]["shape"] == (2, T, H)
    finally:
        runtime.shutdown()


FAILING_STAGE = r'''
from partrain_edu import runtime
from partrain_edu.data import SyntheticTokens
from partrain_edu.config import TrainConfig
from partrain_edu.strategies.pipeline import OneFOneB

ctx = runtime.init()
strategy = OneFOneB(ctx, TrainConfig("pp-1f1b", nproc=2, microbatches=4))
if ctx.rank == 1:
    raise RuntimeError("stage 1 broke")  # stage 0 is left waiting for gradients that never come
strategy.train_step(*SyntheticTokens(128, 32, seed=0).global_batch(0, 16))
'''


def test_a_failing_stage_does_not_leave_the_others_hanging():
    with pytest.raises(TorchrunError) as failure:
        torchrun(FAILING_STAGE, nproc=2, echo=None, timeout=120)
    assert failure.value.rank == 1 and not failure.value.timed_out
    assert "stage 1 broke" in failure.value.rank_traceback
