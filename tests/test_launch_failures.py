"""The launcher on a shared classroom server: whatever the ranks do, `torchrun()` returns, names the right rank, and
leaves nothing running — not even when its own caller is killed. One launch per idea; every case has a deadline."""
import _thread
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from partrain_edu import _procs
from partrain_edu._diagnose import explain_mismatch, failure
from partrain_edu.launch import TorchrunError, TorchrunInterrupted, _Run, call_with_timeout, torchrun
from partrain_edu.notebook import MagicUsageError, parse_magic_line, run_cell_magic
from test_launch import leftovers, new_marker

HEADER = "import os, signal, subprocess, sys, time\nfrom partrain_edu import runtime\nctx = runtime.init()\n"


def launch(body: str, timeout: float = 60, env_extra: dict[str, str] | None = None, **kwargs):
    """Run HEADER + body on 2 ranks; return (result or TorchrunError, seconds, leftover pids)."""
    marker, env = new_marker()
    start = time.perf_counter()
    try:
        outcome = torchrun(HEADER + textwrap.dedent(body), nproc=2, timeout=timeout, echo=None,
                           env={**env, **(env_extra or {})}, **kwargs)
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
    # "finished" when rank 1 wrote its .done before torchrun stopped it, else the same story from the evidence
    assert re.match(r"rank 1 (finished|stopped taking part, without an error,) while rank\(s\) \[0\] still waited "
                    "for it in a collective", str(error)), str(error)
    assert "same collective calls in the same order" in str(error) and "rank 0 was waiting here" in str(error)
    assert str(error).count("Connection closed by peer") == 1 and 0 not in error.outputs  # its traceback once
    assert elapsed < 40 and left == []  # Gloo notices at once; a 45 s collective timeout would be the slow way


def test_a_peer_that_left_without_a_trace_is_named_not_the_rank_it_left_waiting(tmp_path):
    """The race behind the test above: rank 1 finished its script, rank 0's collective failed, and torchrun
    stopped rank 1 before it wrote its .done. Every error blames a vanished peer: the peer is the cause."""
    run = _Run(2, tmp_path, lambda rank, text: None, None)
    for rank in (0, 1):
        (tmp_path / f"rank{rank}.pid").write_text("1")
    (tmp_path / "rank0.error").write_text(json.dumps({"rank": 0, "time": 1.0, "timed_out": False, "traceback":
                                                      "RuntimeError: Connection closed by peer [127.0.0.1]:1\n"}))
    run.launcher += ["  rank      : 1 (local_rank: 1)", "  exitcode  : -15 (pid: 9)  (SIGTERM)"]
    error = failure(run, 1)
    assert error.rank == 1 and str(error).startswith("rank 1 stopped taking part, without an error, while rank(s) "
                                                     "[0] still waited for it in a collective")


def test_mismatched_sizes_in_an_all_reduce_are_explained_with_the_sizes():
    # Gloo aborts the rank that receives more than it expected (SIGABRT) and prints one line on its stderr
    error, elapsed, left = launch("""
        import torch, torch.distributed as dist
        dist.all_reduce(torch.ones(3 if ctx.rank == 0 else 5))
    """)
    assert isinstance(error, TorchrunError) and error.rank in (0, 1)
    assert "collective mismatch" in str(error), str(error)
    assert re.search(r"received \d+ bytes where its own call expected \d+", str(error)), str(error)
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL" in str(error)  # how to see the shapes
    assert elapsed < 40 and left == []


def test_with_detail_set_by_the_caller_the_mismatch_names_each_ranks_shape():
    # The launcher leaves a caller's TORCH_DISTRIBUTED_DEBUG alone; DETAIL checks every collective's fingerprint
    error, _, left = launch("""
        import torch, torch.distributed as dist
        dist.all_reduce(torch.ones(3 if ctx.rank == 0 else 5))
    """, env_extra={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    assert isinstance(error, TorchrunError), error
    text = str(error)
    assert "collective mismatch: rank" in text, text
    assert "all_reduce float32[3]" in text and "all_reduce float32[5]" in text, text
    assert "TensorDeviceTypes" not in text and left == []  # the fingerprint's noise is left out


def test_a_failing_ranks_traceback_is_shown_once():
    error, _, left = launch("""
        if ctx.rank == 1:
            print("before the error")
            raise ValueError("the wrong shape")
    """)
    assert isinstance(error, TorchrunError) and error.rank == 1
    assert str(error).count("ValueError: the wrong shape") == 1
    assert error.outputs.get(1) == "before the error\n"  # what a notebook reprints above the error
    assert "ValueError" in error.rank_traceback and left == []


@pytest.mark.parametrize("text, words", [
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=2, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Double, "
     "TensorDeviceTypes=TensorOptions(dtype=float (default), memory_format=(nullopt))), but Rank 0 is running "
     "collective: CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE, TensorShape=[2, 3], TensorDtypes=Float, "
     "TensorDeviceTypes=TensorOptions(dtype=float (default))).Collectives differ in the following aspects: ",
     "collective mismatch: rank 1 broadcast float64[4], rank 0 all_reduce float32[2, 3] (collective #2"),
    ("CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float), but Rank 1 "
     "is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE).", None),  # no "Rank 0 is" prefix
    ("Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
     "TensorDtypes=Float), but Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=0OpType=REDUCE).",
     "collective mismatch: rank 0 all_reduce float32[4], rank 1 barrier"),
    ("what():  [enforce fail at gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 3000 vs 1000. "
     "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?",
     "collective mismatch: a rank received 3000 bytes where its own call expected 1000"),
    ("RuntimeError: [Rank 0]: Ranks 1, 3 failed to pass monitoredBarrier in 30000 ms",
     "collective mismatch: rank(s) 1,3 never reached this collective"),
    ("RuntimeError: Connection closed by peer [127.0.0.1]:18867", None),
    ("ValueError: the shapes do not match", None),
])
def test_explain_mismatch_reads_every_backend_wording(text, words):
    explained = explain_mismatch(text)
    assert (explained is None) if words is None else explained.startswith(words), explained


def test_the_stop_button_stops_every_rank_and_says_so_in_one_line():
    marker, env = new_marker()
    seen = []

    def press_stop_once_both_ranks_run(rank, text):
        seen.append(rank)
        if len(seen) == 2:
            _thread.interrupt_main()  # what the notebook's stop button does: KeyboardInterrupt in the main thread

    code = HEADER + "print('running', flush=True)\ntime.sleep(600)\n"
    with pytest.raises(KeyboardInterrupt) as info:  # still a KeyboardInterrupt: whatever stops on one stops
        torchrun(code, nproc=2, timeout=None, echo=press_stop_once_both_ranks_run, env=env)
    rendered = info.value._render_traceback_()  # what IPython shows instead of the launcher's stack
    assert isinstance(info.value, TorchrunInterrupted) and len(rendered) == 1 and "\n" not in rendered[0]
    assert re.fullmatch(r"KeyboardInterrupt: interrupted: every rank was stopped \(2 ranks, \d+\.\d s\)",
                        rendered[0]), rendered
    assert info.value.outputs == {0: "running\n", 1: "running\n"} and leftovers(marker) == []


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
