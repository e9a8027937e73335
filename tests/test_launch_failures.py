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

from partrain_edu.launcher import (
    TorchrunError,
    TorchrunInterrupted,
    call_records,
    call_with_timeout,
    processes,
    torchrun,
)
from partrain_edu.launcher.diagnose import findings
from partrain_edu.launcher.diagnose.oneshot import explain_mismatch, failure
from partrain_edu.launcher.output import Run
from partrain_edu.notebook.magics import MagicUsageError, parse_magic_line, run_cell_magic
from test_launch import forkserver_only, leftovers, new_marker

HEADER = "import os, signal, subprocess, sys, time\nfrom partrain_edu import runtime\nctx = runtime.init()\n"


def launch(body: str, timeout: float = 60, env_extra: dict[str, str] | None = None, nproc: int = 2, **kwargs):
    """Run HEADER + body on `nproc` ranks; return (result or TorchrunError, seconds, leftover pids)."""
    marker, env = new_marker()
    start = time.perf_counter()
    try:
        outcome = torchrun(HEADER + textwrap.dedent(body), nproc=nproc, timeout=timeout, echo=None,
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
from partrain_edu.launcher import torchrun
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
    """A closed terminal running `partrain-edu train`, an OOM-killed kernel: the workers, the ranks and their
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
        assert len(leftovers(marker)) >= 7  # the caller, 2 workers, 2 ranks, 2 sleeps
        caller.send_signal(sig)
        deadline = time.monotonic() + 10
        while leftovers(marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert leftovers(marker) == []
        assert list(tmp_path.glob("partrain_*")) == []  # nor the run's temporary folder
    finally:
        caller.kill()
        caller.wait()


@forkserver_only
def test_a_script_that_launches_without_a_main_guard_gets_the_rule_not_endless_ranks(tmp_path):
    # Each rank's worker imports the launching script's top level again (multiprocessing's forkserver and spawn):
    # the launch it meets there is refused by Python itself, with the idiom, and the run fails once
    script = tmp_path / "train.py"
    script.write_text("from partrain_edu.launcher import torchrun\ntorchrun('print(1)', nproc=2, timeout=60)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "if __name__ == '__main__':" in done.stderr, done.stderr[-2000:]


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
    run = Run(2, tmp_path, lambda rank, text: None, None)
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
    assert "all_reduce float32[3]" in str(error) and "all_reduce float32[5]" in str(error)  # the call records
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


def seconds_since_all_arrived(error: TorchrunError) -> float:
    """Time from the last rank's `arrived <time>` line (printed just before its collective) until now."""
    arrivals = [float(line.split()[1]) for text in error.outputs.values() for line in text.splitlines()
                if line.startswith("arrived ")]
    assert arrivals, error.outputs
    return time.time() - max(arrivals)


def test_four_ranks_that_disagree_on_a_shape_are_stopped_within_seconds_with_both_shapes():
    # Gloo lets rank 0 through and leaves ranks 1-3 waiting: only their 45 s collective timeout would end it.
    error, _, left = launch("""
        import torch, torch.distributed as dist
        print("arrived", time.time(), flush=True)
        dist.all_reduce(torch.ones(4 if ctx.rank == 0 else 5))
        time.sleep(120)  # whoever gets through stays: the run never ends by itself
    """, nproc=4)
    assert isinstance(error, TorchrunError) and error.rank == 0, error
    text = str(error)
    assert text.startswith("collective mismatch: rank 0 "), text
    assert "all_reduce float32[4]" in text and "ranks 1–3 in all_reduce float32[5]" in text, text
    assert seconds_since_all_arrived(error) < 10 and left == []


def test_a_rank_that_skipped_a_collective_is_named_while_the_others_wait_for_it():
    error, _, left = launch("""
        import torch, torch.distributed as dist
        dist.all_reduce(torch.ones(4))
        if ctx.rank != 1:
            dist.all_reduce(torch.ones(4))  # rank 1 skips this one ...
        print("arrived", time.time(), flush=True)
        dist.barrier()                      # ... so its barrier meets the others' all_reduce
        time.sleep(120)
    """, nproc=4)
    assert isinstance(error, TorchrunError) and error.rank == 1, error
    assert str(error).startswith("collective mismatch: rank 1 is in barrier (its call #2 on ranks 0–3), ranks 0, 2, "
                                 "3 in all_reduce float32[4]"), str(error)
    assert seconds_since_all_arrived(error) < 10 and left == []


def test_comm_tracer_counts_the_same_bytes_on_top_of_the_call_records():
    result, _, left = launch("""
        import inspect
        from pathlib import Path
        import torch, torch.distributed as dist
        from partrain_edu.launcher import call_records
        from partrain_edu.comm import CommTracer
        from partrain_edu.runtime import PUBLISH_DIR_ENV
        recorded = (dist.all_reduce.__code__.co_filename == call_records.__file__
                    and dist.isend is dist.distributed_c10d.isend)
        signature_kept = inspect.signature(dist.all_reduce) == inspect.signature(inspect.unwrap(dist.all_reduce))
        peer = 1 - ctx.rank
        early = [dist.P2POp(dist.isend, torch.ones(8), peer), dist.P2POp(dist.irecv, torch.empty(8), peer)]
        with CommTracer() as tracer:  # the P2POps above hold the recorder's isend/irecv, not the tracer's
            dist.all_reduce(torch.ones(1000))
            dist.broadcast(torch.ones(10), src=0)
            for work in dist.batch_isend_irecv(early):
                work.wait()
            dist.all_gather_object([None, None], ctx.rank)
        del early, work
        last = call_records.read(Path(os.environ[PUBLISH_DIR_ENV]).parent, 2)[ctx.rank]
        runtime.publish("seen", (recorded, signature_kept, tracer.summary(), last.op, last.state, last.number))
    """)
    assert not isinstance(result, TorchrunError), result
    recorded, signature_kept, summary, *last = result.published["seen"]
    assert recorded and signature_kept
    assert {op: summary[op] for op in ("all_reduce", "broadcast", "isend", "irecv")} == {
        "all_reduce": {"calls": 1, "bytes": 4000}, "broadcast": {"calls": 1, "bytes": 40},  # the ring model, 2 ranks
        "isend": {"calls": 1, "bytes": 32}, "irecv": {"calls": 1, "bytes": 0}}
    assert summary["all_gather_object"]["calls"] == 1
    assert last == ["all_gather", "out", 4]  # all_reduce, broadcast, then all_gather_object's two all_gathers
    assert left == []


def write_calls(folder, *calls: tuple, ranks: tuple[int, ...] = (0, 1, 2, 3)) -> None:
    """Each call: (rank, state, number, op, tensors[, root]) as a rank's recorder writes it, on group "0" of `ranks`."""
    for rank, state, number, op, tensors, *root in calls:
        (folder / f"rank{rank}.calls").write_bytes(call_records._RECORD.pack(
            b"PTC1", state[0].encode(), number, root[0] if root else -1, b"0", ",".join(map(str, ranks)).encode(),
            op.encode(), tensors.encode()))


def test_a_rank_that_ended_is_named_with_how_far_it_got(tmp_path):
    write_calls(tmp_path, (0, "in", 4, "all_reduce", "float32[4]"), (1, "in", 4, "all_reduce", "float32[4]"),
                (2, "out", 3, "all_reduce", "float32[4]"), ranks=(0, 1, 2))
    (tmp_path / "rank2.done").touch()
    assert findings.diagnose(tmp_path, 3).text.startswith(
        "rank 2 ended after 3 collectives while ranks 0, 1 wait in their 4th (all_reduce float32[4] on ranks 0–2). "
        "Every rank must make the same collective calls in the same order")
    assert findings.diagnose(tmp_path, 3, live=True).kind == "behind"  # told at a timeout; never stops a run early


@pytest.mark.parametrize("calls, live, words", [
    # A straggler: the others wait for it, which is no mismatch while it runs; after a timeout it is the story.
    ([(r, "in", 5, "all_reduce", "float32[4]") for r in range(3)] + [(3, "out", 4, "all_reduce", "float32[4]")],
     True, None),
    ([(r, "in", 5, "all_reduce", "float32[4]") for r in range(3)] + [(3, "out", 4, "all_reduce", "float32[4]")],
     False, "rank 3 is elsewhere after 4 collectives while ranks 0–2 wait in their 5th"),
    # Shapes that may differ by rank: uneven all_to_all splits, the root's list of a gather.
    ([(r, "in", 2, "all_to_all_single", f"float32[{4 * (r + 1)}], float32[10]") for r in range(4)], True, None),
    ([(0, "in", 2, "gather", "float32[4], [float32[4]]*4", 0)] + [(r, "in", 2, "gather", "float32[4]", 0)
                                                                  for r in (1, 2, 3)], True, None),
    ([(r, "in", 2, "all_to_all_single", f"float{16 if r else 32}[4], float32[4]") for r in range(4)], True,
     "collective mismatch: rank 0 is in all_to_all_single float32[4], float32[4] (its call #2 on ranks 0–3)"),
    ([(r, "in", 7, "broadcast", "float32[4]", 1 if r == 2 else 0) for r in range(4)], True,
     "collective mismatch: rank 2 is in broadcast float32[4] from rank 1 (its call #7 on ranks 0–3), ranks 0, 1, 3 "
     "in broadcast float32[4] from rank 0: every rank must call"),
    # A call that raised is its rank's own error to tell while the run lasts; after it, where that rank was.
    ([(0, "raised", 2, "all_reduce", "int64[4]")] + [(r, "in", 2, "all_reduce", "float32[4]") for r in (1, 2, 3)],
     True, None),
    ([(0, "raised", 2, "all_reduce", "int64[4]")] + [(r, "in", 2, "all_reduce", "float32[4]") for r in (1, 2, 3)],
     False, "collective mismatch: rank 0 is in all_reduce int64[4] (its call #2 on ranks 0–3), ranks 1–3 in "
     "all_reduce float32[4]: every rank must call"),
    # Ranks at different numbers tell only once every one of them waits.
    ([(0, "in", 3, "all_reduce", "float32[4]"), (1, "in", 2, "all_reduce", "float32[4]"),
      (2, "out", 2, "all_reduce", "float32[4]"), (3, "in", 3, "all_reduce", "float32[4]")], True, None),
    ([(0, "in", 3, "all_reduce", "float32[4]"), (1, "in", 2, "all_reduce", "float32[4]"),
      (2, "in", 3, "all_reduce", "float32[4]"), (3, "in", 3, "all_reduce", "float32[4]")], True,
     "collective mismatch: rank 1 is in all_reduce float32[4] (its call #2 on ranks 0–3), ranks 0, 2, 3 in "
     "all_reduce float32[4] (their call #3)"),
])
def test_the_call_records_tell_a_mismatch_from_ranks_that_are_merely_out_of_step(tmp_path, calls, live, words):
    write_calls(tmp_path, *calls)
    found = findings.diagnose(tmp_path, 4, live=live)
    assert (found is None) if words is None else found.text.startswith(words), found


def test_a_watch_reports_a_mismatch_only_once_it_has_stood_still(tmp_path, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(findings.time, "monotonic", lambda: clock[0])
    watch = findings.Watch(tmp_path, 2)

    def poll_at(t: float, *calls: tuple):
        clock[0] = t
        write_calls(tmp_path, *calls, ranks=(0, 1))
        return watch.poll()

    assert poll_at(100.0, (0, "in", 1, "all_reduce", "float32[4]"), (1, "in", 1, "all_reduce", "float32[5]")) is None
    assert poll_at(100.6, (0, "in", 2, "all_reduce", "float32[4]"), (1, "in", 2, "all_reduce", "float32[5]")) is None
    assert poll_at(101.2, (0, "in", 2, "all_reduce", "float32[4]"), (1, "in", 2, "all_reduce", "float32[5]")) is None
    found = poll_at(101.8, (0, "in", 2, "all_reduce", "float32[4]"), (1, "in", 2, "all_reduce", "float32[5]"))
    assert found is not None and found.rank == 0 and "float32[5]" in found.text  # the same records 1.2 s apart


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
    ("what():  [enforce fail at gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. 3000 vs 1000. "
     "Received data size doesn't match expected size. Is there a distributed collective mismatch in your code?",
     "collective mismatch: a rank received 3000 bytes where its own call expected 1000"),
    # DETAIL's own report is left to the call records (test_with_detail_set_by_the_caller_...), which say it in
    # the same words with or without DETAIL
    ("RuntimeError: Detected mismatch between collectives on ranks. Rank 1 is running collective: "
     "CollectiveFingerPrint(SequenceNumber=2, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Double), but Rank 0 "
     "is running collective: CollectiveFingerPrint(SequenceNumber=2, OpType=ALLREDUCE, TensorShape=[2, 3], "
     "TensorDtypes=Float).", None),
    ("RuntimeError: Connection closed by peer [127.0.0.1]:18867", None),
    ("ValueError: the shapes do not match", None),
])
def test_explain_mismatch_reads_gloos_size_check_only(text, words):
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
from partrain_edu.launcher import nanny, processes
run_dir = os.path.dirname(os.environ[runtime.PUBLISH_DIR_ENV])
pids = [os.getpid()] + [p.pid for p in nanny.members(run_dir, os.environ[processes.RUN_ENV])]
inodes = set()
for pid in pids:
    for link in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
addresses = {"store": [], "ranks": []}
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for row in open(table).read().splitlines()[1:]:
        fields = row.split()
        address, port = fields[1].split(":")
        if fields[3] == "0A" and int(port, 16) == int(os.environ["MASTER_PORT"]):  # 0A: LISTEN
            addresses["store"].append(address)  # the store torch's agent shares with the ranks: the launcher's
        elif fields[3] == "0A" and fields[9] in inodes:
            addresses["ranks"].append(address)
dist.barrier()
runtime.publish("addresses", addresses)
"""


def test_the_run_listens_on_loopback_only():
    result, _, _ = launch(LISTENING)
    assert not isinstance(result, TorchrunError), result
    addresses = result.published["addresses"]
    assert len(addresses["store"]) == 1 and len(addresses["ranks"]) >= 1, addresses  # the agent's store, Gloo
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    assert set(addresses["store"]) | set(addresses["ranks"]) <= loopback, addresses


STOP_HARNESS = """
import os, pathlib, subprocess, tempfile
from partrain_edu.launcher.output import Run
from partrain_edu.launcher.supervise import stop
run = Run(1, pathlib.Path(tempfile.mkdtemp()), lambda rank, text: None, None)
(run.run_dir / "rank0.pid").write_text("")  # a rank between open("w") and write(): the old launcher read PID 0
sibling = subprocess.Popen(["sleep", "30"])  # shares this process group, which is not the run's
member = subprocess.Popen(["sleep", "31"], env={**os.environ, "PARTRAIN_RUN_ID": run.run_id},
                          start_new_session=True)
torchrun_stand_in = subprocess.Popen(["sleep", "32"], start_new_session=True)
stop([torchrun_stand_in], run)
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
        now = processes.read(sleeper.pid)
        reused = processes.Proc(now.pid, now.ppid, now.pgid, now.start - 1)  # same PID, another process's start time
        processes.signal_each([reused], signal.SIGKILL)
        time.sleep(0.2)
        assert sleeper.poll() is None
        processes.signal_each([now], signal.SIGKILL)
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
