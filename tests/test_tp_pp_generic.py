"""Tensor and pipeline parallelism on models the library has never seen (tests/unseen_tp_pp_models.py): a plain MLP
and a small attention language model split by a plan (against one process, and the MLP against DTensor's
`parallelize_module`), and a stack of six differently shaped layers cut into stages under GPipe, 1F1B and
interleaved 1F1B (against one process). One launch per world size (rank side: tests/ranks/tp_pp_generic.py);
the one-line refusals run here, in one process."""
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import unseen_tp_pp_models as um
from partrain_edu import runtime
from partrain_edu.launcher import torchrun
from partrain_edu.parallel.pipeline import PipelineExecutor, Stage, split_layers
from partrain_edu.parallel.pp_comm import Boundary, Mailbox
from partrain_edu.parallel.tensor import check_plan, parallelize
from partrain_edu.parallel.torch_tp import dtensor_plan
from partrain_edu.strategies.base import in_flag_words
from partrain_edu.theory.schedules import build_schedule

RANKS = Path(__file__).parent / "ranks" / "tp_pp_generic.py"
FP32 = 1e-5                   # relative: partial products summed over ranks round differently from one matmul


@pytest.fixture(scope="module", params=[2, 4])
def ranks(request):
    return request.param, torchrun(RANKS, nproc=request.param, timeout=300, echo=None).published["results"]


def test_a_planned_mlp_equals_one_process_and_dtensor(ranks):
    t, everyone = ranks
    for res in (everyone[r]["mlp"] for r in range(t)):
        assert res["widths"] == [32 // t, 32 // t] and res["complete"], res    # each rank holds 1/t of both
        assert max(res["output"], res["input_grad"], res["grads"]) < FP32, res
        assert max(res["dtensor"].values()) < FP32, res["dtensor"]          # the same shards, outputs, gradients


def test_an_attention_model_equals_one_process_under_tp_and_sp(ranks):
    t, everyone = ranks
    for rank in everyone:
        for name in ("lm tp", "lm tp-default-f", "lm sp"):
            res = rank[name]
            assert res["complete"] and res["heads"] == um.AttentionLM.HEADS // t, (name, res)
            assert res["loss"] < FP32 and res["grads"] < FP32, (name, res)
        # per block: g after attention and after the MLP forward; f before each backward. Plus the embedding's g,
        # the head's f and the loss's 3 all-reduces. Without `inputs`, query, key and value each run their own f.
        blocks = 2
        assert rank["lm tp"]["calls"] == {"forward all_reduce": 2 * blocks + 1 + 3,
                                          "backward all_reduce": 2 * blocks + 1}
        assert rank["lm tp-default-f"]["calls"] == {"forward all_reduce": 2 * blocks + 1 + 3,
                                                    "backward all_reduce": 4 * blocks + 1}


def test_a_stack_of_differently_shaped_layers_equals_one_process_under_every_schedule(ranks):
    p, everyone = ranks
    runs = {f"pp {s} cuts=None" for s in ("gpipe", "1f1b")} | ({"pp interleaved cuts=None", "pp 1f1b cuts=[4]"}
                                                                if p == 2 else set())
    for rank in everyone:
        assert {k for k in rank if k.startswith("pp ")} == runs
        for name in runs:
            assert rank[name]["grads"] < FP32, (name, rank[name])
    for name in runs:
        assert [rank[name]["loss"] is not None for rank in everyone] == [s == p - 1 for s in range(p)]
        assert everyone[p - 1][name]["loss"] < 1e-6, name
        # each boundary's shape is what the layer before it outputs for a micro-batch of 2
        outputs = [[2, 24], [2, 12], [2, 2, 8], [2, 20], [2, 6]]
        ranges = everyone[0][name]["ranges"]
        assert everyone[0][name]["shapes"] == [outputs[hi - 1] for _, hi in ranges[:-1]], name
    assert everyone[0]["pp gpipe cuts=None"]["ranges"] == ([(0, 2), (2, 6)] if p == 2 else  # 516 | 702 parameters
                                                           [(0, 1), (1, 2), (2, 3), (3, 6)])  # 216 | 300 | 208 | 494


@pytest.mark.parametrize("plan, tp, inputs, words", [
    ({"3": "colwise"}, 2, (),
     "plan pattern '3' matches no submodule of Sequential: use its submodule names, e.g. 0, 2"),
    ({"0": "colwise"}, 2, ("mlp",), "inputs pattern 'mlp' matches no submodule"),
    ({"1": "colwise"}, 2, (), "'1' is a GELU, but 'colwise' splits an nn.Linear: point the pattern at nn.Linear"),
    ({"0": "vocab"}, 2, (), "'0' is a Linear, but 'vocab' splits an nn.Embedding"),
    ({"0": "diagonal"}, 2, (), "unknown style 'diagonal' for '0': use one of colwise, rowwise, vocab"),
    ({"0": "colwise", "2": "rowwise"}, 3, (), "tp=3 does not divide the 32 output features of '0': every rank "
                                              "needs an equal slice; use tp=1, 2, 4, 8, 16, 32"),
    ({"2": "rowwise"}, 2, ("2",), "inputs entry '2' holds no colwise layer"),
])
def test_a_bad_plan_is_refused_in_one_line_naming_the_fix(plan, tp, inputs, words):
    with pytest.raises(ValueError) as error:
        check_plan(um.plain_mlp(), plan, tp, inputs)
    assert str(error.value).startswith(words) and "\n" not in str(error.value)


def test_plans_on_a_model_with_patterns_and_the_harness_wording():
    styles = check_plan(um.AttentionLM(), um.LM_PLAN, 4, um.LM_INPUTS)
    assert styles["tok"] == "vocab" and styles["layers.1.attn.out"] == "rowwise" and len(styles) == 1 + 2 * 6 + 1
    with pytest.raises(ValueError, match=r"^--tp 5 does not divide the 24 rows of 'tok'.*use --tp 1, 2, 4, 8$"):
        with in_flag_words():
            check_plan(um.AttentionLM(), um.LM_PLAN, 5)
    with pytest.raises(ValueError, match="^inputs entries 'layers.0' and 'layers.0.attn' nest: f would run twice"):
        check_plan(um.AttentionLM(), um.LM_PLAN, 2, inputs=("layers.*",) + um.LM_INPUTS)
    with pytest.raises(ValueError, match="both a plan entry and an input"):
        dtensor_plan({"head": "colwise"}, inputs=("head",))


@pytest.fixture
def world_of_one():
    runtime.init()
    yield
    runtime.shutdown()


def test_parallelize_refuses_before_it_changes_anything(world_of_one):
    mlp = um.plain_mlp()
    with pytest.raises(ValueError, match="matches no submodule"):
        parallelize(mlp, {"0": "colwise", "fc": "rowwise"}, None)
    assert type(mlp[0]) is torch.nn.Linear and not mlp[0]._forward_pre_hooks   # left as it was


def test_bad_stage_counts_are_refused_naming_the_fix():
    stack = um.widths_stack()
    with pytest.raises(ValueError, match="^7 pipeline stages for the model's 6 layers: use at least 1 and at most 6"):
        split_layers(stack, 7)
    with pytest.raises(ValueError, match=r"^boundaries must be 1 increasing layer indices in 1\.\.5, got \[6\]"):
        split_layers(stack, 2, boundaries=[6])
    assert split_layers(stack, 2, pre=torch.nn.Linear(100, 100)) == [(0, 1), (1, 6)]  # pre weighs on stage 0
    stage = Stage(stack, 0, 3)
    with pytest.raises(ValueError, match="give 2 chunks, 2 ranks and a Mailbox of 3 boundaries"):
        PipelineExecutor(build_schedule("interleaved", 2, 4, 2), [stage], 0, [0, 1],
                         Mailbox([Boundary((2, 24))], 4), F.mse_loss)
