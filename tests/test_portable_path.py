"""The launcher on the portable path — what macOS and any platform where forking torch is unsafe get: each rank's
worker and the rank itself start afresh (PARTRAIN_START_METHOD=spawn, as off Linux) instead of being forked from
the forkserver, and processes are found through psutil as everywhere. `make test` runs the launcher, warm-pool,
diagnosis and grading test files a second time with PARTRAIN_START_METHOD=spawn (PORTABLE in the Makefile); these
are the tests of the switch itself."""

import os

import pytest

from partrain_edu.launcher import start, torchrun


@pytest.fixture(autouse=True)
def portable(monkeypatch):
    monkeypatch.setenv(start.START_METHOD_ENV, "spawn")  # inherited by the grader's kernels too


def test_the_worker_and_the_rank_start_afresh_not_from_the_forkserver():
    # torch's agent (in this process) starts the worker itself, and the rank has not imported torch yet
    code = "import sys\nprint('torch' in sys.modules)\nimport psutil\nprint(psutil.Process().parent().ppid())\n"
    result = torchrun(code, nproc=1, echo=None)
    assert result.outputs == {0: f"False\n{os.getpid()}\n"}


def test_a_start_method_other_than_forkserver_or_spawn_is_refused(monkeypatch):
    monkeypatch.setenv(start.START_METHOD_ENV, "fork")
    with pytest.raises(ValueError, match="PARTRAIN_START_METHOD must be forkserver or spawn, not 'fork'"):
        torchrun("print(1)", nproc=1, echo=None)
