"""The launcher on the portable path — what macOS and any platform where forking torch is unsafe get: each rank's
worker and the rank itself start afresh (PARTRAIN_START_METHOD=spawn, as off Linux) instead of being forked from
the forkserver, and processes are found through psutil as everywhere. The same tests as on the fast path, called as
they are: one-shot runs, a raising, a killed and a looping rank, an interrupt, children left running, and warm
pools."""

import os

import pytest

import test_grading_hostile
import test_launch
import test_launch_failures
import test_warm
from partrain_edu.launcher import start, torchrun


@pytest.fixture(autouse=True)
def portable(monkeypatch):
    monkeypatch.setenv(start.START_METHOD_ENV, "spawn")  # inherited by the grader's kernels too


def test_the_worker_and_the_rank_start_afresh_not_from_the_forkserver():
    # torch's agent (in this process) starts the worker itself, and the rank has not imported torch yet
    code = "import sys\nprint('torch' in sys.modules)\nimport psutil\nprint(psutil.Process().parent().ppid())\n"
    result = torchrun(code, nproc=1, echo=None)
    assert result.outputs == {0: f"False\n{os.getpid()}\n"}


def test_all_ranks_run_and_rank0_publishes_and_torchrun_leaves_no_files(tmp_path):
    test_launch.test_all_ranks_run_and_rank0_publishes_and_torchrun_leaves_no_files(tmp_path)


def test_a_raising_rank_surfaces_its_own_traceback():
    test_launch.test_a_raising_rank_surfaces_its_own_traceback()


def test_a_rank_killed_by_a_signal_is_named():
    test_launch.test_a_rank_killed_by_a_signal_is_named()


def test_the_launcher_timeout_stops_a_rank_looping_outside_any_collective():
    test_launch.test_the_launcher_timeout_stops_a_rank_looping_outside_any_collective()


def test_a_kernel_interrupt_kills_every_rank():
    test_launch.test_a_kernel_interrupt_kills_every_rank()


def test_children_left_running_neither_hang_the_launch_nor_outlive_it():
    test_launch_failures.test_children_left_running_neither_hang_the_launch_nor_outlive_it()


def test_a_killed_rank_brings_the_pool_down_and_is_named():
    test_warm.test_a_killed_rank_brings_the_pool_down_and_is_named()


def test_ranks_left_waiting_for_a_raising_rank_bring_the_pool_down():
    test_warm.test_ranks_left_waiting_for_a_raising_rank_bring_the_pool_down()


def test_a_looping_submission_graded_without_a_sandbox_ends_at_its_limit_with_a_score_of_0(tmp_path):
    test_grading_hostile.test_unsandboxed_fallback_still_grades_and_says_so(tmp_path)


def test_a_start_method_other_than_forkserver_or_spawn_is_refused(monkeypatch):
    monkeypatch.setenv(start.START_METHOD_ENV, "fork")
    with pytest.raises(ValueError, match="PARTRAIN_START_METHOD must be forkserver or spawn, not 'fork'"):
        torchrun("print(1)", nproc=1, echo=None)
