"""The launcher on a shared classroom server: whatever the ranks do, `torchrun()` returns, names the right rank, and
leaves nothing running — not even when its own caller is killed. One launch per idea; every case has a deadline."""
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from partrain_edu import _procs
from partrain_edu.launch import TorchrunError, call_with_timeout, torchrun
from partrain_edu.notebook import MagicUsageError, parse_magic_line, run_cell_magic
from test_launch import leftovers, new_marker

HEADER = "import os, signal, subprocess, sys, time\nfrom partrain_edu import runtime\nctx = runtime.init()\n"


def launch(body: str, timeout: float = 60, **kwargs):
    """Run HEADER + body on 2 ranks; return (result or TorchrunError, seconds, leftover pids)."""
    marker, env = new_marker()
    start = time.perf_counter()
    try:
        outcome = torchrun(HEADER + textwrap.dedent(body), nproc=2, timeout=timeout, echo=None, env=env, **kwargs)
    except TorchrunError as error:
        outcome = error
    return outcome, time.perf_counter() - start, leftovers(marker)


def test_children_left_running_neither_hang_the_launch_nor_outlive_it():
    # They inherit the rank's stdout: the old launcher waited for that pipe to close, i.e. forever.
    result, elapsed, left = launch("""
        subprocess.Popen(["sleep", "600"])
        subprocess.Popen(["sleep", "601"], start_new_session=True)  # not even in the rank's process group
        print("done")
    """)
    assert not isinstance(result, TorchrunError), result
    assert result.outputs == {0: "done\n", 1: "done\n"}
    assert elapsed < 60 and left == []  # generous: a loaded 2-core machine starts 2 ranks in 5-15 s


def test_any_bytes_anyone_writes_on_a_rank_are_shown_as_that_rank():
    result, _, left = launch("""
        os.write(1, b"\\xff\\xfe not UTF-8\\n")       # below print(): straight to the file descriptor
        os.write(2, b"raw stderr\\n")
        subprocess.run(["echo", "from a child"])
        print("still alive", flush=True)
    """)
    assert not isinstance(result, TorchrunError), result
    for rank in (0, 1):
        assert result.outputs[rank] == "\ufffd\ufffd not UTF-8\nraw stderr\nfrom a child\nstill alive\n"
    assert left == [] and "UTF-8" not in result.launcher_output and "raw stderr" not in result.launcher_output


CALLER = """
import sys
from partrain_edu.launch import torchrun
code = '''
import subprocess, time
subprocess.Popen(["sleep", "600"], start_new_session=True)
print("started", flush=True)
time.sleep(600)
'''
torchrun(code, nproc=2, timeout=None, env={"PARTRAIN_TEST_MARKER": sys.argv[1]})
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_nothing_survives_a_killed_caller(tmp_path, sig):
    """A closed terminal running `partrain-edu train`, an OOM-killed kernel: torchrun, the ranks and their
    children (one in a session of its own) must all go with it."""
    marker, _ = new_marker()
    log = tmp_path / "caller.log"
    with open(log, "w") as out:
        caller = subprocess.Popen([sys.executable, "-c", CALLER, marker], stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "TMPDIR": str(tmp_path)}, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while log.read_text().count("started") < 2:
            assert caller.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        assert len(leftovers(marker)) >= 7  # torchrun, 2 ranks, their 2 labellers, 2 sleeps
        caller.send_signal(sig)
        deadline = time.monotonic() + 10
        while leftovers(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert leftovers(marker) == []
        assert list(tmp_path.glob("partrain_*")) == []  # nor the run's temporary folder
    finally:
        caller.kill()
        caller.wait()


def test_a_rank_killed_outside_a_collective_is_named_not_the_rank_torchrun_stopped():
    error, elapsed, left = launch("""
        if ctx.rank == 1:
            time.sleep(1)
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
        time.sleep(120)
    """, timeout=200)
    assert isinstance(error, TorchrunError) and error.rank == 1
    assert str(error).startswith("rank 1 was killed by signal SIGKILL")
    assert elapsed < 60 and left == []  # rank 0 was stopped, not waited for


def test_a_rank_that_skips_a_collective_and_finishes_is_named():
    error, elapsed, left = launch("""
        import torch, torch.distributed as dist
        if ctx.rank == 0:
            dist.all_reduce(torch.ones(1))
    """)
    assert isinstance(error, TorchrunError) and error.rank == 1
    assert str(error).startswith("rank 1 finished while rank(s) [0] still waited for it in a collective")
    assert "same collective calls in the same order" in str(error) and "rank 0 was waiting here" in str(error)
    assert elapsed < 40 and left == []  # Gloo notices at once; a 45 s collective timeout would be the slow way


LISTENING = """
import glob
import torch.distributed as dist
from partrain_edu import _procs
pids = [os.getpid()] + [p.pid for p in _procs.run_members(os.environ[_procs.RUN_ENV])]
inodes = set()
for pid in pids:
    for link in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
addresses = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in open(table).read().splitlines()[1:]:
        fields = row.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            addresses.append(fields[1].split(":")[0])
dist.barrier()
runtime.publish("addresses", addresses)
"""


def test_the_run_listens_on_loopback_only():
    result, _, _ = launch(LISTENING)
    assert not isinstance(result, TorchrunError), result
    addresses = result.published["addresses"]
    assert len(addresses) >= 3, addresses  # torchrun's rendezvous store, its store for the ranks, Gloo
    assert set(addresses) <= {"0100007F", "00000000000000000000000001000000"}, addresses  # 127.0.0.1, ::1


STOP_HARNESS = """
import os, pathlib, subprocess, tempfile
from partrain_edu.launch import _Run, _stop
run = _Run(1, pathlib.Path(tempfile.mkdtemp()), lambda rank, text: None, None)
(run.run_dir / "rank0.pid").write_text("")  # a rank between open("w") and write(): the old launcher read PID 0
sibling = subprocess.Popen(["sleep", "30"])  # shares this process group, which is not the run's
member = subprocess.Popen(["sleep", "31"], env={**os.environ, "PARTRAIN_RUN_ID": run.run_id},
                          start_new_session=True)
torchrun_stand_in = subprocess.Popen(["sleep", "32"], start_new_session=True)
_stop(torchrun_stand_in, run)
print("member killed", member.wait(5), "sibling alive", sibling.poll() is None, "torchrun", torchrun_stand_in.poll())
sibling.kill()
"""


def test_stopping_a_run_kills_its_processes_and_nothing_else():
    done = subprocess.run([sys.executable, "-c", STOP_HARNESS], capture_output=True, text=True, timeout=60,
                          start_new_session=True)  # if it killed its own group, it would take only itself
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "member killed -15 sibling alive True torchrun -15"


def test_a_pid_whose_process_changed_is_never_signalled():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        now = _procs.read(sleeper.pid)
        reused = _procs.Proc(now.pid, now.ppid, now.pgid, now.start - 1)  # same PID, another process's start time
        _procs.signal_each([reused], signal.SIGKILL)
        time.sleep(0.2)
        assert sleeper.poll() is None
        _procs.signal_each([now], signal.SIGKILL)
        assert sleeper.wait(5) == -signal.SIGKILL
    finally:
        sleeper.kill()


@pytest.mark.parametrize("line", ["-n x", "--timeout -1", "--timeout nan", "--timeout 0", "--bogus", "-n 2 --rank 5",
                                  "-n 0", '-- "unclosed'])
def test_a_bad_magic_line_is_one_line(line):
    with pytest.raises(MagicUsageError) as info:
        run_cell_magic(line, "print(1)", {})
    rendered = info.value._render_traceback_()  # what IPython shows instead of a traceback
    assert len(rendered) == 1 and "\n" not in rendered[0] and rendered[0].startswith("UsageError: %%torchrun: ")


def test_magic_timeout_none_lifts_the_limit():
    options, script_args = parse_magic_line("-n 3 --timeout none -- --timeout 5")
    assert options.timeout is None and options.nproc == 3 and script_args == ["--timeout", "5"]


def test_call_with_timeout_stops_in_process_work():
    assert call_with_timeout(lambda: 42, 5) == 42
    start = time.perf_counter()
    with pytest.raises(TorchrunError, match="timed out after 0.5 s") as info:
        call_with_timeout(lambda: any(math.sqrt(i) < 0 for i in iter(int, 1)), 0.5)  # endless
    assert info.value.timed_out and time.perf_counter() - start < 10
    with pytest.raises(ValueError, match="timeout must be a positive, finite number"):
        call_with_timeout(lambda: 42, float("nan"))
