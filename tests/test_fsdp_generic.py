"""FullyShardedDataParallel on models the library has never seen (tests/unseen_models.py): frozen, unused branch,
tied embedding/head, BatchNorm, mixed fp32/bf16, uneven sizes — units chosen by a policy and by a list, AdamW
with two param groups built by name. Against one process (state dict, the whole optimizer state, every `step`),
mixed precision against fp32, the bytes one step sends against ZeRO-3's, and against PyTorch's FSDP2. One
launch of 4 ranks (rank side: tests/ranks/fsdp_generic.py); refusals and errors run here, in a world of one."""
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import unseen_models as um
from partrain_edu import runtime
from partrain_edu.launcher import torchrun
from partrain_edu.parallel.fsdp import FullyShardedDataParallel

RANKS = Path(__file__).parent / "ranks" / "fsdp_generic.py"
FP32, BF16 = 1e-5, 2e-2       # relative; bf16 gradients averaged over ranks round differently from one batch's


@pytest.fixture(scope="module", params=[4])
def results(request):
    return torchrun(RANKS, nproc=request.param, timeout=300, echo=None).published["results"]


def test_every_model_and_unit_choice_matches_one_process(results):
    cases = [c for c in results if not c.startswith(("traffic", "uneven vs"))]
    assert len(cases) == 2 * len(um.MODELS) + 4
    for case in cases:
        res = results[case]
        tol = BF16 if case.startswith("mixed") or "precision" in case else FP32
        assert res["keys"] and res["ints"] and res["dtypes"] and res["params"] < tol, (case, res)
        assert res["state_names"] and res["steps"] and res["moments"] < 10 * tol, (case, res)
        assert res["reloaded"], case
    assert results["frozen policy"]["frozen_unchanged"] and results["frozen list"]["frozen_unchanged"]
    assert all(results[c]["tied"] for c in ("tied policy", "tied list", "tied mixed precision"))
    # every Linear its own unit: the root owns nothing; the tied weight goes to the root, the head unit is empty
    assert results["branch policy"]["units"] == [0, 1, 1, 1] and results["tied policy"]["units"] == [1, 0, 1, 0]
    assert results["mixed list"]["units"] == [2]                      # one unit, one FlatShard per dtype


def test_one_step_sends_exactly_zero3s_bytes_in_the_gather_and_reduce_dtypes(results):
    for label in ("traffic fp32", "traffic bf16"):
        assert results[label]["sent"] == results[label]["theory"], (label, results[label])
    fp32, bf16 = results["traffic fp32"]["sent"], results["traffic bf16"]["sent"]
    assert bf16["all_gather_single"] * 2 == fp32["all_gather_single"]             # gathered in bf16
    assert bf16["reduce_scatter_single"] == fp32["reduce_scatter_single"]         # reduced in fp32


def test_same_parameters_as_pytorch_fsdp2(results):
    res = results["uneven vs fully_shard"]
    assert res["params"] < FP32 and res["moved"] > 1e-3, res


@pytest.fixture
def world_of_one():
    runtime.init()
    yield
    runtime.shutdown()


def test_units_must_be_submodules(world_of_one):
    model = um.build("branch")
    for units in ([model], [nn.Linear(2, 2)]):
        with pytest.raises(ValueError, match="submodule of the wrapped module"):
            FullyShardedDataParallel(model, units=units)


def test_a_weight_read_outside_forward_names_state_dict(world_of_one):
    model = um.build("branch")
    fsdp = FullyShardedDataParallel(model, units=[model.rare])
    with pytest.raises(AttributeError, match=r"common\.weight is sharded .* fsdp\.state_dict\(\)"):
        _ = model.common.weight.shape
    with pytest.raises(RuntimeError, match=r"common\.weight is sharded .*summon_full_params"):
        model.common(torch.zeros(1, um.IN))              # a root's layer called outside the wrapper's forward
    with fsdp.summon_full_params():
        assert torch.equal(model.rare.weight, um.build("branch").rare.weight)
    assert fsdp.gathered_bytes_now == 0


def test_root_without_parameters_empty_units_no_grad_and_every_buffer_freed(world_of_one):
    model = um.build("tied")
    fsdp = FullyShardedDataParallel(model, units=[model.emb, model.mid, model.head])
    assert [len(u.shards) for u in fsdp.units] == [1, 0, 1, 0]      # emb.weight, used by two units: the root's
    alone = FullyShardedDataParallel(um.build("branch"), units=lambda name, m: isinstance(m, nn.Linear))
    assert [len(u.shards) for u in alone.units] == [0, 1, 1, 1]
    for wrapped, name in ((fsdp, "tied"), (alone, "branch")):
        x, y = um.batch(name, 0)
        with torch.no_grad():
            wrapped(x)
        um.loss(wrapped, name, x, y, 0).backward()
        assert wrapped.gathered_bytes_now == 0 and all(p.grad is not None for p in wrapped.parameters())
        assert len(wrapped.timeline) <= 6 * len(wrapped.units)     # one forward and its backward, no more
