"""Nothing a run starts outlives it (issue 30, L1): a rank's child that double-forks, calls setsid and clears
its environment — invisible to the /proc scan by run id or ancestry — is gone when `torchrun()` returns and when
a warm pool stops, because every run gets a cgroup of its own where the machine allows (`cgroup.py`)."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from conftest import processes_with
from partrain_edu.launcher import cgroup, torchrun
from partrain_edu.launcher.warm.pool import Pool


def cgroups_here() -> bool:
    path = cgroup.create("probe-" + uuid.uuid4().hex)
    cgroup.kill(path)
    return path is not None


pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(
    not cgroups_here(), reason="no writable cgroup v2 with cgroup.kill here: the README names the limit")]

DAEMON = """import os
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.execve('/bin/sleep', ['sleep', '{seconds}'], {{}})
    os._exit(0)
os.waitpid(pid, 0)
"""


def wait_for(condition, tries: int = 100) -> bool:
    """True once `condition()` holds (a grandchild execs `sleep` a moment after its cell ended), else False."""
    for _ in range(tries):
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def unique_seconds() -> str:
    return f"600.{uuid.uuid4().int % 10**9:09d}"   # a number `sleep` accepts, and a marker nobody else has


def test_the_daemon_of_a_one_shot_run_is_gone_when_torchrun_returns():
    seconds = unique_seconds()
    torchrun(DAEMON.format(seconds=seconds), nproc=2, timeout=60)
    assert processes_with(f"sleep {seconds}") == []


def test_the_daemon_of_a_warm_rank_is_gone_when_the_pool_stops():
    seconds = unique_seconds()
    pool = Pool(2, timeout=60, echo=None)
    try:
        pool.run(DAEMON.format(seconds=seconds))
        assert wait_for(lambda: len(processes_with(f"sleep {seconds}")) == 2)   # alive while the pool is up
    finally:
        pool.stop()
    assert processes_with(f"sleep {seconds}") == []


def test_a_run_cgroup_is_removed_once_killed():
    path = cgroup.create(uuid.uuid4().hex)
    cgroup.kill(path)
    assert not os.path.exists(path)


def test_the_daemon_is_gone_when_the_caller_is_killed(tmp_path):
    """The launcher SIGKILLed mid-run: the ranks' watchdogs kill the run's cgroup, the daemon in it."""
    seconds = unique_seconds()
    script = tmp_path / "caller.py"
    script.write_text("from partrain_edu.launcher import torchrun\nif __name__ == '__main__':\n"
                      f"    torchrun({DAEMON.format(seconds=seconds) + 'import time; time.sleep(600)'!r}, nproc=2)\n")
    caller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(processes_with(f"sleep {seconds}")) == 2, tries=600)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    assert wait_for(lambda: not processes_with(f"sleep {seconds}"))   # the watchdogs look every 0.5 s
