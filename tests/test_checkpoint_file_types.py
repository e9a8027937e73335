"""Every checkpoint file is checked with lstat — a regular file, not a link, not a FIFO — before it is opened
(issue 30, L5): a FIFO as `.metadata` used to block `checkpoint.load` for ever in `open()`."""
import os
import threading

import pytest

from partrain_edu import checkpoint, checkpoint_files, runtime
from partrain_edu.data import SyntheticTokens
from partrain_edu.strategies.zero import Zero1
from partrain_edu.train import TrainConfig

pytestmark = pytest.mark.timeout(120)   # a FIFO that is opened blocks: fail here, not at the suite's limit


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(a fresh Zero1, a folder holding a committed step-1) in one single-rank process group."""
    ctx = runtime.init()
    try:
        cfg, root = TrainConfig(strategy="zero1"), tmp_path_factory.mktemp("ck") / "ck"
        strategy = Zero1(ctx, cfg)
        strategy.train_step(*SyntheticTokens().global_batch(0, 16))
        checkpoint.save(strategy, root, step=1)
        yield lambda: Zero1(ctx, cfg), root
    finally:
        runtime.shutdown()


def _replace(path, how, tmp_path):
    """`path` swapped for a FIFO or for a link to a copy of itself (the same bytes: only its type is wrong)."""
    data = path.read_bytes()
    path.unlink()
    if how == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "copy").write_bytes(data)
        path.symlink_to(tmp_path / "copy")
    return data


def _refusal(fresh, root):
    result = {}

    def load():
        try:
            checkpoint.load(fresh(), root)
        except ValueError as error:
            result["error"] = str(error)
    worker = threading.Thread(target=load, daemon=True)   # a blocked open() must not hang the test itself
    worker.start()
    worker.join(60)
    return result.get("error", "load blocked or did not refuse")


@pytest.mark.parametrize("name", [".metadata", "checksums.json", "__0_0.distcp", "LATEST"])
@pytest.mark.parametrize("how, kind", [("fifo", "is a FIFO"), ("link", "is a symbolic link")])
def test_a_checkpoint_file_that_is_a_fifo_or_a_link_is_refused_unopened(saved, tmp_path, name, how, kind):
    fresh, root = saved
    path = root / name if name == "LATEST" else root / "step-1" / name
    data = _replace(path, how, tmp_path)
    try:
        error = _refusal(fresh, root)
    finally:
        path.unlink()
        path.write_bytes(data)
    assert f"{name} {kind}, not a saved file" in error and "\n" not in error


def test_kind_of_names_what_lstat_sees(tmp_path):
    (tmp_path / "file").write_text("x")
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    kinds = [checkpoint_files.kind_of(tmp_path / n) for n in ("file", "fifo", "link", ".", "gone")]
    assert kinds == [None, "a FIFO", "a symbolic link", "a folder", "missing"]
