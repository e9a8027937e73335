"""Sharded checkpoints: saved at 4 ranks and loaded at 2 (and 2 → 4, and 4 → 1) with identical parameters and
optimizer state and the same losses afterwards; a save killed halfway leaves the previous checkpoint loadable,
also when it re-saves the same step; a mismatching checkpoint, a pickled object, a damaged file and a LATEST
that points anywhere but a step-K of the folder are refused in one line. Three launches; the rest runs in
this process.
"""
import json
import os
import pickle
import shutil

import pytest
import torch

from partrain_edu import checkpoint, checkpoint_files, runtime
from partrain_edu.data import SyntheticTokens
from partrain_edu.launcher import TorchrunError, torchrun
from partrain_edu.models import GPTConfig, TinyGPT
from partrain_edu.strategies.fsdp import Zero3
from partrain_edu.strategies.zero import Zero1
from partrain_edu.train import TrainConfig

SCRIPT = r"""
import json, os, sys, torch, torch.distributed as dist
import torch.distributed.checkpoint as dcp
from partrain_edu import runtime, checkpoint
from partrain_edu.data import SyntheticTokens
from partrain_edu.strategies.fsdp import Zero3
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
    # every flat shard's AdamW moments, all-gathered from the pieces' states: {"i.key": (Ψ_i,)}
    flats, state = checkpoint._sharded(s)
    return {f"{i}.{key}": flat.gather_state([state.get(p, {}).get(key) for p in flat.pieces])
            for i, flat in enumerate(flats) for key in checkpoint.ADAM_STATES}

def steps():
    flats, state = checkpoint._sharded(s)
    return [float(state[p]["step"]) if p in state else -1.0 for flat in flats for p in flat.pieces]

res = {}
if load_first:
    start = checkpoint.load(s, root)
    ref = torch.load(os.path.join(root, f"ref-{start}.pt"), weights_only=True)
    params, moments = s.model.full_state_dict(), full_moments()
    res["start"] = start
    res["params_identical"] = all(torch.equal(params[k], v) for k, v in ref["params"].items())
    res["moments_identical"] = all(torch.equal(moments[k], v) for k, v in ref["moments"].items())
    res["steps_identical"] = steps() == ref["steps"]
else:
    start = 0
res["resumed"] = [step(k) for k in range(start, save_at)]
if save_at > start:
    checkpoint.save(s, root, step=save_at)
    checkpoint.export_full(s, os.path.join(root, "full.pt"))
    ref = {"params": s.model.full_state_dict(), "moments": full_moments(), "steps": steps()}
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
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


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
    assert not (root / "step-99").exists() and list(root.glob(".step-99.tmp-*"))   # written, never committed
    ctx = runtime.init()                                               # 2 → 1 rank, here in process
    try:
        s = Zero3(ctx, TrainConfig(strategy="zero3"))
        assert checkpoint.load(s, root) == 4
        ref = torch.load(root / "ref-4.pt", weights_only=True)
        params = s.model.full_state_dict()
        assert all(torch.equal(params[k], v) for k, v in ref["params"].items())
        flats, state = checkpoint._sharded(s)
        for i, flat in enumerate(flats):                               # one rank: the pieces are the whole
            for key in checkpoint.ADAM_STATES:
                moments = flat.gather_state([state.get(p, {}).get(key) for p in flat.pieces])
                assert torch.equal(moments, ref["moments"][f"{i}.{key}"])
        exported = TinyGPT()
        checkpoint.load_full(exported, root / "full.pt")              # one file, weights only
        assert all(torch.equal(exported.state_dict()[k], v) for k, v in ref["params"].items())
        with pytest.raises(ValueError, match="does not match this model"):
            checkpoint.load(Zero3(ctx, TrainConfig(model=GPTConfig(vocab_size=127))), root)
        with pytest.raises(ValueError, match="does not match this model"):
            checkpoint.load_full(TinyGPT(GPTConfig(n_embd=32)), root / "full.pt")
    finally:
        runtime.shutdown()


def test_zero1_saves_and_loads_its_optimizer_pieces(tmp_path):
    """ZeroOptimizer's states live per parameter piece: a reload gives the same next steps."""
    ctx = runtime.init()
    try:
        data, cfg = SyntheticTokens(), TrainConfig(strategy="zero1")
        s = Zero1(ctx, cfg)
        for k in range(2):
            s.train_step(*data.global_batch(k, 16))
        checkpoint.save(s, tmp_path, step=2)
        expected = [s.train_step(*data.global_batch(k, 16))[0] for k in (2, 3)]
        again = Zero1(ctx, cfg)
        assert checkpoint.load(again, tmp_path) == 2
        assert [again.train_step(*data.global_batch(k, 16))[0] for k in (2, 3)] == expected
        assert again.optimizer.state_dict()["state"].keys() == s.optimizer.state_dict()["state"].keys()
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
        with pytest.raises(pickle.UnpicklingError,
                           match="refusing to load torch.distributed.checkpoint.filesystem.os.system"):
            checkpoint.load(Zero3(ctx, TrainConfig(strategy="zero3")), tmp_path)
    finally:
        runtime.shutdown()
    assert not marker.exists()


# -- atomic re-saves and damaged checkpoints, in a world of one --------------------------------------------------

@pytest.fixture
def zero1(tmp_path):
    """A trained Zero1 saved as step 1 in `tmp_path/ck`; yields (strategy, a fresh strategy, root, saved params)."""
    ctx = runtime.init()
    try:
        data, cfg = SyntheticTokens(), TrainConfig(strategy="zero1")
        s = Zero1(ctx, cfg)
        s.train_step(*data.global_batch(0, 16))
        checkpoint.save(s, tmp_path / "ck", step=1)
        saved = checkpoint.full_state_dict(s)
        s.train_step(*data.global_batch(1, 16))      # the parameters move on: a re-save would differ
        yield s, lambda: Zero1(ctx, cfg), tmp_path / "ck", saved
    finally:
        runtime.shutdown()


def loads_step_1_as_saved(fresh, root, saved) -> bool:
    again = fresh()
    assert checkpoint.load(again, root) == 1
    params = checkpoint.full_state_dict(again)
    return all(torch.equal(params[k], v) for k, v in saved.items())


def one_line_error(call) -> str:
    with pytest.raises(ValueError) as err:
        call()
    assert "\n" not in str(err.value)
    return str(err.value)


def test_a_resave_killed_while_writing_leaves_the_previous_step_whole(zero1, monkeypatch):
    """D9: re-saving step 1 used to overwrite step-1 in place; dying halfway left LATEST on a mix of both."""
    s, fresh, root, saved = zero1
    from torch.distributed.checkpoint import FileSystemWriter
    original = FileSystemWriter.write_data

    def write_then_die(self, plan, planner):   # this rank's shard is fully written, then the process "dies"
        original(self, plan, planner).wait()
        raise RuntimeError("killed")
    monkeypatch.setattr(FileSystemWriter, "write_data", write_then_die)
    message = one_line_error(lambda: checkpoint.save(s, root, step=1))
    assert "saving step 1" in message and "killed" in message and "LATEST still names" in message
    assert (root / "LATEST").read_text() == "step-1"
    assert loads_step_1_as_saved(fresh, root, saved)


def test_a_resave_killed_between_its_renames_still_loads_the_previous_step(zero1, monkeypatch):
    """The old step-1 is moved aside before the new one takes its name; a kill in between must not leave LATEST
    naming nothing, and the next save puts the old folder back and clears what the dead save left."""
    s, fresh, root, saved = zero1
    real_replace = os.replace

    def dies_before_the_new_folder_lands(src, dst):   # only the rename of the new folder into step-1
        if os.path.basename(src).startswith(".step-1.tmp-") and os.path.basename(dst) == "step-1":
            raise OSError(5, "killed")
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", dies_before_the_new_folder_lands)
    one_line_error(lambda: checkpoint.save(s, root, step=1))
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (root / "step-1").exists() and (root / ".step-1.previous").is_dir()
    assert loads_step_1_as_saved(fresh, root, saved)
    checkpoint.save(s, root, step=2)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-1", "step-2"]
    (root / "LATEST").write_text("step-1")            # the folder put back is the first save, whole
    assert loads_step_1_as_saved(fresh, root, saved)


def test_a_resave_replaces_the_step_and_leaves_nothing_behind(zero1):
    s, fresh, root, saved = zero1
    checkpoint.save(s, root, step=1)
    assert sorted(p.name for p in root.iterdir()) == ["LATEST", "step-1"]
    assert not loads_step_1_as_saved(fresh, root, saved)        # the second save's parameters now
    manifest = json.loads((root / "step-1" / checkpoint_files.MANIFEST).read_text())
    assert set(manifest) == {p.name for p in (root / "step-1").iterdir()} - {checkpoint_files.MANIFEST}


def flip_a_byte(folder):
    shard = next(folder.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))


def truncate(folder, name="*.distcp", keep=0.5):
    path = next(folder.glob(name))
    path.write_bytes(path.read_bytes()[:int(path.stat().st_size * keep)])


@pytest.mark.parametrize("damage, words", [
    (flip_a_byte, "__0_0.distcp does not match its SHA-256"),
    (truncate, "__0_0.distcp has"),
    (lambda f: truncate(f, keep=0), "__0_0.distcp has 0 bytes"),
    (lambda f: next(f.glob("*.distcp")).unlink(), "__0_0.distcp is missing"),
    (lambda f: truncate(f, ".metadata"), ".metadata ("),
    (lambda f: (f / ".metadata").write_bytes(pickle.dumps({"a": 1})), "not DCP metadata"),
    (lambda f: (f / ".metadata").write_text('{"a": 1}'), "damaged or not a checkpoint"),
    (lambda f: (f / checkpoint_files.MANIFEST).unlink(), "has no checksums.json"),
    (lambda f: (f / checkpoint_files.MANIFEST).write_text("{"), "checksums.json is damaged"),
    (lambda f: (f / checkpoint_files.MANIFEST).write_text('{"../LATEST": {"bytes": 6, "sha256": ""}}'),
     "names '../LATEST', not a file of the folder"),
])
def test_a_damaged_checkpoint_is_refused_in_one_line_naming_the_file(zero1, damage, words):
    s, fresh, root, saved = zero1
    damage(root / "step-1")
    message = one_line_error(lambda: checkpoint.load(fresh(), root))
    assert words in message and "restore the folder from a copy" in message


@pytest.mark.parametrize("latest, words", [
    (b"../elsewhere/step-1", "names '../elsewhere/step-1', not a step-K folder"),
    (b"/tmp/step-1", "not a step-K folder"),
    (b"\xff\xfe", "LATEST is not text"),
    (b"step-7", "there is no folder"),
])
def test_latest_names_only_a_step_folder_inside_the_root(zero1, latest, words):
    s, fresh, root, saved = zero1
    elsewhere = root.parent / "elsewhere"
    shutil.copytree(root, elsewhere)                        # a loadable checkpoint outside the root
    (root / "LATEST").write_bytes(latest)
    assert words in one_line_error(lambda: checkpoint.load(fresh(), root))


def link_a_shard_elsewhere(folder):
    shard = next(folder.glob("*.distcp"))
    copy = folder.parent.parent / "elsewhere.distcp"
    shutil.copyfile(shard, copy)                            # the same bytes: only the link gives it away
    shard.unlink()
    shard.symlink_to(copy)


def link_the_step_elsewhere(folder):
    elsewhere = folder.parent.parent / "elsewhere-step"
    shutil.move(folder, elsewhere)
    folder.symlink_to(elsewhere, target_is_directory=True)


@pytest.mark.parametrize("damage, words", [
    (link_the_step_elsewhere, "step-1 is a symbolic link, not a checkpoint saved here"),
    (link_a_shard_elsewhere, "__0_0.distcp is a symbolic link, not a saved file"),
])
def test_a_symbolic_link_is_never_followed(zero1, damage, words):
    s, fresh, root, saved = zero1
    damage(root / "step-1")
    assert words in one_line_error(lambda: checkpoint.load(fresh(), root))


def test_saving_where_nothing_can_be_written_is_one_line(zero1):
    s, fresh, root, saved = zero1
    (root / "a_file").write_text("not a folder")
    assert "cannot write a checkpoint into" in one_line_error(lambda: checkpoint.save(s, root / "a_file" / "ck", 1))
    assert "cannot write a checkpoint into" in one_line_error(lambda: checkpoint.save(s, "/proc/ck", 1))
