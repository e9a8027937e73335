"""Sharded checkpoints: saved at 4 ranks and loaded at 2 (and 2 → 4, and 4 → 1) with identical parameters and
optimizer state and the same losses afterwards; a save killed halfway leaves the previous checkpoint loadable;
a mismatching checkpoint or a pickled object is refused. Three launches; the rest runs in this process.
"""
import json
import pickle

import pytest
import torch

from partrain_edu import checkpoint, runtime
from partrain_edu.launch import TorchrunError, torchrun
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.parallel.fsdp import Zero3
from partrain_edu.train import TrainConfig

SCRIPT = r"""
import json, os, sys, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from partrain_edu import runtime, checkpoint
from partrain_edu.data import SyntheticTokens
from partrain_edu.parallel.fsdp import Zero3
from partrain_edu.train import TrainConfig

ctx = runtime.init()
n, r = ctx.world_size, ctx.rank
root, load_first, save_at, crash = sys.argv[1], sys.argv[2] == "load", int(sys.argv[3]), sys.argv[4] == "crash"
data = SyntheticTokens()
s = Zero3(ctx, TrainConfig(strategy="zero3", nproc=n))

def step(k):
    l, c = s.train_step(*data.global_batch(k, 16))
    t = torch.tensor([l, c], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0] / t[1])

def full_moments():
    out = {}
    for i, u in enumerate(s.model.units):
        for key in checkpoint.ADAM_STATES:
            full = torch.empty(u.flat.padded)
            dist.all_gather_single(full, s.optimizer.state[u.flat.shard][key].contiguous())
            out[f"{i}.{key}"] = full[:u.flat.numel]
    return out

res = {}
if load_first:
    start = checkpoint.load(s, root)
    ref = torch.load(os.path.join(root, f"ref-{start}.pt"), weights_only=True)
    params, moments = s.model.full_state_dict(), full_moments()
    res["start"] = start
    res["params_identical"] = all(torch.equal(params[k], v) for k, v in ref["params"].items())
    res["moments_identical"] = all(torch.equal(moments[k], v) for k, v in ref["moments"].items())
    res["steps_identical"] = all(float(s.optimizer.state[u.flat.shard]["step"]) == ref["step"] for u in s.model.units)
else:
    start = 0
res["resumed"] = [step(k) for k in range(start, save_at)]
if save_at > start:
    checkpoint.save(s, root, step=save_at)
    checkpoint.export_full(s, os.path.join(root, "full.pt"))
    ref = {"params": s.model.full_state_dict(), "moments": full_moments(),
           "step": float(s.optimizer.state[s.model.units[0].flat.shard]["step"])}
    if r == 0:
        torch.save(ref, os.path.join(root, f"ref-{save_at}.pt"))
    dist.barrier()
res["after"] = [step(k) for k in range(save_at, save_at + 2)]
if crash:   # rank 1 writes its shard, then dies before the save can commit
    if r == 0:
        with open(os.path.join(root, "before_crash.json"), "w") as f:
            json.dump(res, f)
    dist.barrier()
    if r == 1:
        from torch.distributed.checkpoint import FileSystemWriter
        original = FileSystemWriter.write_data
        def write_then_die(self, plan, planner):
            fut = original(self, plan, planner)
            fut.wait()
            os._exit(1)
        FileSystemWriter.write_data = write_then_die
    checkpoint.save(s, root, step=99)
runtime.publish("result", res)
"""


def _run(root, nproc, mode, save_at, crash=False):
    args = [str(root), mode, str(save_at), "crash" if crash else "no"]
    return torchrun(SCRIPT, nproc=nproc, args=args, timeout=240, echo=None).published["result"]


def _rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("ckpt")
    at4 = _run(root, 4, "save", 2)                 # 4 ranks: 2 steps, save step-2, 2 more steps
    at2 = _run(root, 2, "load", 4)                 # 2 ranks: load step-2, 2 steps, save step-4, 2 more
    with pytest.raises(TorchrunError):             # 4 ranks: load step-4, 2 steps, a save killed on rank 1
        _run(root, 4, "load", 4, crash=True)
    back4 = json.loads((root / "before_crash.json").read_text())
    return root, at4, at2, back4


def test_saved_at_4_loads_at_2_and_at_2_loads_at_4_identically(saved):
    root, at4, at2, back4 = saved
    for loaded, start in ((at2, 2), (back4, 4)):
        assert loaded["start"] == start
        assert loaded["params_identical"] and loaded["moments_identical"] and loaded["steps_identical"]
    # the same losses afterwards as the run that saved (world sizes differ: float32 summation order only)
    assert _rel(at2["resumed"], at4["after"]) < 1e-5
    assert _rel(back4["after"], at2["after"]) < 1e-5


def test_killed_save_leaves_the_previous_checkpoint_loadable(saved):
    root = saved[0]
    assert (root / "LATEST").read_text() == "step-4"
    assert (root / "step-99").is_dir() and not (root / "step-99" / ".metadata").exists()   # never committed
    ctx = runtime.init()                                               # 2 → 1 rank, here in process
    try:
        s = Zero3(ctx, TrainConfig(strategy="zero3"))
        assert checkpoint.load(s, root) == 4
        ref = torch.load(root / "ref-4.pt", weights_only=True)
        params = s.model.full_state_dict()
        assert all(torch.equal(params[k], v) for k, v in ref["params"].items())
        for i, u in enumerate(s.model.units):
            for key in checkpoint.ADAM_STATES:
                assert torch.equal(s.optimizer.state[u.flat.shard][key][:u.flat.numel], ref["moments"][f"{i}.{key}"])
        exported = TinyGPT()
        checkpoint.load_full(exported, root / "full.pt")              # one file, weights only
        assert all(torch.equal(exported.state_dict()[k], v) for k, v in ref["params"].items())
        with pytest.raises(ValueError, match="does not match this model"):
            checkpoint.load(Zero3(ctx, TrainConfig(model=GPTConfig(vocab_size=127))), root)
        with pytest.raises(ValueError, match="does not match this model"):
            checkpoint.load_full(TinyGPT(GPTConfig(n_embd=32)), root / "full.pt")
    finally:
        runtime.shutdown()


def test_a_pickled_object_in_the_metadata_is_refused(tmp_path):
    folder = tmp_path / "step-1"
    folder.mkdir()
    (folder / ".metadata").write_bytes(pickle.dumps(print))           # any callable: never built
    (tmp_path / "LATEST").write_text("step-1")
    with pytest.raises(pickle.UnpicklingError, match="refusing to load builtins.print"):
        checkpoint._metadata(checkpoint.latest(tmp_path))
    with pytest.raises(ValueError, match="no checkpoint"):
        checkpoint.latest(tmp_path / "nowhere")


def test_a_crafted_metadata_naming_a_function_through_a_dotted_name_runs_nothing(tmp_path):
    """D1: pickle resolves ("torch.distributed.checkpoint.filesystem", "os.system") to os.system, a module
    prefix is no allowlist. The payload would create `marker`; it must be refused before anything is built."""
    marker = tmp_path / "marker"
    module, name = b"torch.distributed.checkpoint.filesystem", b"os.system"
    command = f"touch {marker}".encode()
    payload = (b"\x80\x04" + b"\x8c" + bytes([len(module)]) + module + b"\x8c" + bytes([len(name)]) + name
               + b"\x93" + b"\x8c" + bytes([len(command)]) + command + b"\x85R.")   # STACK_GLOBAL, REDUCE
    folder = tmp_path / "step-1"
    folder.mkdir()
    (folder / ".metadata").write_bytes(payload)
    (tmp_path / "LATEST").write_text("step-1")
    ctx = runtime.init()
    try:
        with pytest.raises(pickle.UnpicklingError, match="refusing to load torch.distributed.checkpoint.filesystem.os.system"):
            checkpoint.load(Zero3(ctx, TrainConfig(strategy="zero3")), tmp_path)
    finally:
        runtime.shutdown()
    assert not marker.exists()
