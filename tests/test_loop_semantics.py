"""The training loop a PyTorch user writes (issue 27), at 4 ranks (rank side: tests/ranks/loop_accumulation.py):
gradient accumulation over 4 micro-batches reducing once (DDP and FSDP in no_sync, ZeroOptimizer's own way),
torch.utils.checkpoint around FSDP units and tensor-parallel blocks, FSDP's parameters visible — each against
one process and beside PyTorch's DDP no_sync and FSDP2. The package names its wrappers (clipping:
tests/test_loop_semantics_clipping.py)."""
import subprocess
import sys
from pathlib import Path

import pytest

from partrain_edu.launcher import torchrun

RANKS = Path(__file__).parent / "ranks" / "loop_accumulation.py"
FP32 = 1e-6


@pytest.fixture(scope="module", params=[4])
def results(request):
    return torchrun(RANKS, nproc=request.param, timeout=300, echo=None).published["results"]


def test_accumulating_four_micro_batches_equals_one_process_and_reduces_once(results):
    for rank in results:
        for case in ("DDP no_sync", "FSDP no_sync", "ZeroOptimizer stage 1", "ZeroOptimizer stage 2 no_sync",
                     "DDP every micro-batch", "FSDP every micro-batch", "ZeroOptimizer stage 2"):
            res = rank[case]
            assert res["params"] < FP32, (case, res)
            assert all(sum(step.values()) == res["expected"] for step in res["calls"]), (case, res)
        assert rank["DDP no_sync"]["expected"] * 4 == rank["DDP every micro-batch"]["expected"]
        assert rank["FSDP no_sync"]["expected"] * 4 == rank["FSDP every micro-batch"]["expected"]


def test_same_parameters_as_pytorch_ddp_no_sync_and_fsdp2_without_gradient_sync(results):
    for rank in results:
        assert rank["PyTorch DDP no_sync"]["params"] < FP32
        assert rank["PyTorch FSDP2 without gradient sync"]["params"] < FP32


def test_checkpointed_fsdp_units_regather_for_the_recomputation_and_free_after(results):
    for rank in results:
        for ckpt in ("True", "reentrant", "False"):
            res = rank[f"FSDP checkpoint={ckpt}"]
            assert res["grads"] < 1e-5 and res["after"] == 0, (ckpt, res)
            assert res["backward_gathers"] == res["units"], (ckpt, res)       # once per unit in backward
            recomputed = [(unit, now) for phase, edge, unit, now in res["seen"] if phase == "backward" and edge == "in"]
            if ckpt == "False":
                assert recomputed == []
                continue
            assert [u for u, _ in recomputed] == [3, 2, 1]                    # every unit, last first
            # gathered then: the root (re-read for the output layer's backward) and this unit, never more
            assert all(now == res["unit_bytes"][0] + res["unit_bytes"][u] for u, now in recomputed), res


def test_checkpointed_tensor_parallel_blocks_give_one_process_gradients(results):
    for rank in results:
        assert all(rank[f"TP checkpoint={c}"]["grads"] < 1e-5 for c in ("True", "reentrant", "False"))


def test_fsdp_lists_every_parameter_on_the_module_and_the_wrapper(results):
    for rank in results:
        assert rank["visible"] == {"module": True, "wrapper": True, "same pieces": True, "one dimension": True}


def test_the_package_names_its_wrappers_and_stays_free_of_torch_until_asked():
    code = ("import sys\nimport partrain_edu.parallel as parallel\nassert 'torch' not in sys.modules\n"
            "from partrain_edu.parallel import (DistributedDataParallel, ZeroOptimizer, FullyShardedDataParallel,\n"
            "    MixedPrecision, parallelize, PipelineExecutor, RingAttention, clip_grad_norm_tp)\n"
            "from partrain_edu.parallel.fsdp import FullyShardedDataParallel as F\n"
            "assert F is FullyShardedDataParallel and parallel.zero.ZeroOptimizer is ZeroOptimizer\n"
            "assert 'FullyShardedDataParallel' in dir(parallel)\n"
            "try:\n    parallel.NoSuchWrapper\nexcept AttributeError as e:\n    print(e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "has no attribute 'NoSuchWrapper'" in done.stdout
