"""The launcher on the portable path — what macOS and any platform without a forking server get: each launch's
torchrun starts afresh instead of being forked by `agent_server` (its FORKS_AGENTS off, as off Linux), and
processes are found through psutil as everywhere. The same tests as on the fast path, called as they are:
one-shot runs, a raising, a killed and a looping rank, an interrupt, children left running, and warm pools."""

import pytest

import test_launch
import test_launch_failures
import test_warm
from partrain_edu.launcher import agent_server, torchrun


@pytest.fixture(autouse=True)
def portable(monkeypatch):
    monkeypatch.setattr(agent_server, "FORKS_AGENTS", False)


def test_the_agent_starts_afresh_not_from_the_server():
    code = "import os, psutil\nprint(' '.join(psutil.Process(os.getppid()).cmdline()[1:3]))\n"
    result = torchrun(code, nproc=1, echo=None)
    assert result.outputs == {0: "-m partrain_edu.launcher.agent\n"}, result.outputs


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
