"""launcher.processes, on psutil: a run's processes are found by their run id or their ancestry and stopped, a
session's by its id or the leader's descendants, and a process whose PID now names another is never signalled."""
import os
import signal
import subprocess
import sys
import time
import uuid

from partrain_edu.launcher import processes

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]
# a marked process that starts an unmarked child in a session of its own: found through its ancestry
PARENT = ("import os, subprocess, sys, time; env = {k: v for k, v in os.environ.items() if k != 'PARTRAIN_RUN_ID'}; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env=env, start_new_session=True); "
          "time.sleep(60)")


def _wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def test_a_run_is_its_marked_processes_and_their_descendants_and_stop_ends_them_all():
    run_id = uuid.uuid4().hex
    parent = subprocess.Popen([sys.executable, "-c", PARENT], env={**os.environ, processes.RUN_ENV: run_id})
    try:
        assert _wait_for(lambda: len(processes.run_members(run_id)) == 2)
        members = processes.run_members(run_id)
        assert members[0].pid == parent.pid or members[1].pid == parent.pid
        processes.stop(lambda: processes.run_members(run_id), grace_s=1.0)
        assert processes.run_members(run_id) == [] and parent.wait(5) == -signal.SIGTERM
    finally:
        parent.kill()
        parent.wait()


def test_a_process_whose_start_time_differs_is_never_signalled():
    proc = subprocess.Popen(SLEEP)
    try:
        seen = processes.read(proc.pid)
        assert seen is not None and processes.is_running(f"{seen.pid}:{seen.start}")
        stale = processes.Proc(seen.pid, seen.ppid, seen.pgid, seen.start - 1, seen.session)  # "a reused PID"
        processes.signal_each([stale], signal.SIGKILL)
        time.sleep(0.2)
        assert proc.poll() is None and not processes.is_running(f"{seen.pid}:{seen.start - 1}")
        processes.signal_each([seen], signal.SIGKILL)
        assert proc.wait(5) == -signal.SIGKILL and processes.read(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_session_is_its_members_and_the_leaders_descendants():
    leader = subprocess.Popen([sys.executable, "-c", PARENT], start_new_session=True)
    try:
        assert _wait_for(lambda: len(processes.session_members(leader.pid)) == 2)  # the child left the session
        processes.stop(lambda: processes.session_members(leader.pid), grace_s=0.0)
        assert processes.session_members(leader.pid) == [] and leader.wait(5) != 0
    finally:
        leader.kill()
        leader.wait()


def test_a_run_is_signalled_children_first():
    """A rank's watchdog signals the run from inside it while the other rank's watchdog signals this rank: what
    the ranks started comes first, or a rank SIGTERMed mid-sweep leaves it running (seen as a non-root user,
    where no cgroup catches it)."""
    agent, rank0, rank1, child, grandchild = (processes.Proc(pid, ppid, 0, 0) for pid, ppid in
                                              ((10, 1), (11, 10), (12, 10), (13, 11), (14, 13)))
    order = [p.pid for p in processes.children_first([agent, rank0, rank1, child, grandchild])]
    assert order[0] == 14 and order.index(13) < order.index(11) and order[-1] == 10


def test_from_inside_a_run_the_callers_own_children_count_as_deep_as_the_other_ranks_children():
    """A rank's watchdog lists the run without itself: its own children must still come before the other ranks, or
    the other rank's watchdog, killed first, never reaches them (1 run in 3 as a non-root user, no cgroup)."""
    me, my_worker = os.getpid(), os.getppid()
    procs = [processes.Proc(my_worker, 1, 0, 0), processes.Proc(10, 1, 0, 0), processes.Proc(11, 10, 0, 0),
             processes.Proc(12, me, 0, 0), processes.Proc(13, 11, 0, 0)]  # other worker, other rank, two children
    order = [p.pid for p in processes.children_first(procs)]
    assert order.index(12) < order.index(11) and order.index(13) < order.index(11), order
