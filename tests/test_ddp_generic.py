"""Our DistributedDataParallel on models it has never seen (tests/unseen_models.py), with two micro-batches the
first under `no_sync`: the same parameters as one process and as PyTorch's DDP (fp32 tolerance; bit for bit
at 2 ranks),
dtypes and ties kept, and an unused parameter refused without `find_unused_parameters`, as PyTorch refuses it.
One launch per world size; rank side: tests/ranks/ddp_generic.py."""
from pathlib import Path

import pytest

from partrain_edu.launcher import torchrun

RANKS = Path(__file__).parent / "ranks" / "ddp_generic.py"


@pytest.fixture(scope="module", params=[2, 4])
def results(request):
    return torchrun(RANKS, nproc=request.param, timeout=300, echo=None).published["results"]


def test_every_model_matches_one_process_and_pytorch_ddp(results):
    for name, res in results.items():
        if name == "refused":
            continue
        tolerance = 2e-2 if name == "mixed" else 1e-5     # bf16 gradients averaged over ranks round differently
        assert res["single"] < tolerance and res["torch"] < tolerance, (name, res)
        assert res["dtypes"] and res["tied"], name


def test_a_parameter_without_a_gradient_is_refused_naming_the_fix(results):
    assert "['rare.weight', 'rare.bias'] got no gradient" in results["refused"]
    assert "find_unused_parameters=True" in results["refused"]
