"""ZeroOptimizer on models the library has never seen (tests/unseen_models.py): frozen, unused, tied, BatchNorm,
mixed fp32/bf16, uneven sizes, two AdamW param groups, SGD with momentum, micro-batches. Against one process
(parameters, buffers, the whole optimizer state dict) and against DDP + ZeroRedundancyOptimizer. One launch of
4 ranks (rank side: tests/ranks/zero_optimizer.py); refusals run here, in a world of one."""
from pathlib import Path

import pytest
import torch

import unseen_models as um
from partrain_edu import runtime
from partrain_edu.launcher import torchrun
from partrain_edu.parallel.zero import ZeroOptimizer

RANKS = Path(__file__).parent / "ranks" / "zero_optimizer.py"
FP32, BF16 = 1e-5, 2e-2       # relative; bf16 gradients averaged over ranks round differently from one batch's


@pytest.fixture(scope="module", params=[4])
def results(request):
    return torchrun(RANKS, nproc=request.param, timeout=300, echo=None).published["results"]


def test_every_model_matches_one_process_in_parameters_and_optimizer_state(results):
    for case, res in results.items():
        if "ZeroRedundancyOptimizer" in case:
            continue
        tol = BF16 if case.startswith("mixed") else FP32
        assert res["params"] < tol and res["buffers"] == 0.0 and res["dtypes"], (case, res)
        assert isinstance(res["state"], float) and res["state"] < 10 * tol, (case, res["state"])
        assert res["groups"] and res["reloaded"] == 0.0, case
    assert results["frozen stage1 adamw m1"]["frozen_unchanged"]          # no weight decay on a frozen weight


def test_same_parameters_as_ddp_with_zero_redundancy_optimizer(results):
    for name in ("frozen", "uneven"):
        assert results[f"{name} vs ZeroRedundancyOptimizer"]["params"] < FP32


@pytest.fixture
def world_of_one():
    runtime.init()
    yield
    runtime.shutdown()


def test_one_rank_is_bit_identical_to_the_plain_optimizer(world_of_one):
    for name in ("branch", "tied"):
        ref, mine = um.build(name), um.build(name)
        ref_opt = torch.optim.AdamW(um.param_groups(ref), lr=1e-2)
        opt = ZeroOptimizer(um.param_groups(mine), torch.optim.AdamW, lr=1e-2)
        for step in range(4):
            for model, o in ((ref, ref_opt), (mine, opt)):
                o.zero_grad()
                um.loss(model, name, *um.batch(name, step), step).backward()
                o.step()
        assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), mine.parameters(), strict=True)), name
        assert opt.state_dict()["state"].keys() == ref_opt.state_dict()["state"].keys()


def test_what_it_cannot_do_is_refused_with_the_fix(world_of_one):
    model = um.build("uneven")
    with pytest.raises(ValueError, match="elementwise=True"):
        ZeroOptimizer(model.parameters(), torch.optim.LBFGS)
    with pytest.raises(ValueError, match="FullyShardedDataParallel"):
        ZeroOptimizer(model.parameters(), stage=3)
    with pytest.raises(ValueError, match="no parameter with requires_grad"):
        ZeroOptimizer(um.build("uneven").requires_grad_(False).parameters())
    opt = ZeroOptimizer(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="constructor"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.ones(2))]})
