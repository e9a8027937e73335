"""The launcher: results, published values, and every way a rank can fail — each a clear error within seconds,
with nothing left running."""
import _thread
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from partrain_edu.launcher import TorchrunError, torchrun
from partrain_edu.notebook.magics import run_cell_magic

MARKER_ENV = "PARTRAIN_TEST_MARKER"


def leftovers(marker: str) -> list[int]:
    """Live processes (not zombies) whose environment or command line holds `marker`. Pass the marker with
    `env={MARKER_ENV: marker}`: every process of the launch inherits it, whatever session or parent it has now."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            seen = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in seen and state != "Z":
            found.append(int(entry.name))
    return found


def new_marker() -> tuple[str, dict[str, str]]:
    marker = f"marker-{uuid.uuid4().hex}"
    return marker, {MARKER_ENV: marker}

ALL_REDUCE = """
import sys
import torch, torch.distributed as dist
from partrain_edu import runtime
ctx = runtime.init()
t = torch.tensor([float(ctx.rank + 1)])
dist.all_reduce(t)
print(f"rank {ctx.rank} of {ctx.world_size} sees {t.item():.0f}; args {sys.argv[1:]}")
runtime.publish("total", t.item())
runtime.publish("world", ctx.world_size)
"""

FAILING = """
import os, signal, sys, time
import torch, torch.distributed as dist
from partrain_edu import runtime
ctx = runtime.init(timeout=5)  # collectives give up after 5 s
mode = sys.argv[1]

def broken_layer():
    raise ValueError("weights of rank 1 have the wrong shape")

if ctx.rank == 1:
    if mode == "raise":
        broken_layer()
    if mode == "hang":
        time.sleep(600)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
if mode == "sleep":
    time.sleep(600)
dist.all_reduce(torch.ones(4))
print("unreachable for rank 0")
"""


def test_all_ranks_run_and_rank0_publishes_and_torchrun_leaves_no_files(tmp_path):
    lines = []
    result = torchrun(ALL_REDUCE, nproc=3, args=["--lr", "0.1"], echo=lambda r, t: lines.append((r, t)),
                      env={"TMPDIR": str(tmp_path)})  # where torchrun and the ranks put temporary files
    assert result.returncode == 0
    assert result.published == {"total": 6.0, "world": 3}
    for rank in range(3):
        assert result.outputs[rank] == f"rank {rank} of 3 sees 6; args ['--lr', '0.1']\n"
    assert sorted(lines) == [(r, f"rank {r} of 3 sees 6; args ['--lr', '0.1']") for r in range(3)]
    assert result.wall_s > 0
    assert list(tmp_path.iterdir()) == []  # torchrun's logs went with the run's folder, not to a torchelastic_*


FORKED = """
import ctypes, faulthandler, json, os, signal, sys
had = {m: m in sys.modules for m in ("torch", "torch._dynamo")}  # before this script imported anything
pdeathsig = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(json.dumps({**had, "own_session": os.getsid(0) == os.getpid(), "pdeathsig": pdeathsig.value,
                  "faulthandler": faulthandler.is_enabled(),
                  "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}), flush=True)
os._exit(0)  # no return to torchrun: still a clean finish, as in a process of its own
"""


def test_ranks_are_forked_with_torch_imported_and_start_as_processes_of_their_own():
    # torch is imported once, by torchrun's process, and `preload` adds to it; each rank then undoes what it
    # inherited from torchrun: its signal handlers, fault handler, parent-death signal and session
    plain, preloaded = (torchrun(FORKED, nproc=2, echo=None, preload=p).outputs for p in ((), ["torch._dynamo"]))
    fresh = {"own_session": True, "sigterm_default": True, "pdeathsig": 0, "faulthandler": False}
    assert {r: json.loads(text) for r, text in plain.items()} == \
        {r: {"torch": True, "torch._dynamo": False, **fresh} for r in range(2)}
    assert {r: json.loads(text) for r, text in preloaded.items()} == \
        {r: {"torch": True, "torch._dynamo": True, **fresh} for r in range(2)}


SERVED = """
import json, os, sys
agent = os.getppid()  # the rank was forked by its agent
server = int(open(f"/proc/{agent}/stat").read().rsplit(")", 1)[1].split()[1])
environ = open(f"/proc/{agent}/environ", "rb").read().split(b"\\0")
print(json.dumps({"server": server, "cmdline": open(f"/proc/{server}/cmdline").read().split("\\0")[:3],
                  "marked": f"{sys.argv[1]}={os.environ[sys.argv[1]]}".encode() in environ,
                  "hash": hash("partrain")}), flush=True)
"""


def test_each_agent_is_forked_by_a_server_yet_looks_like_an_exec_d_one(monkeypatch):
    # One server per kind of interpreter: two launches share one; a different PYTHONHASHSEED (read when Python
    # starts) gets a server of its own, and with room for one server only, the first one ends. Each agent shows
    # its run's environment in /proc, where runs are found.
    from partrain_edu.launcher import agent_server, processes

    monkeypatch.setattr(agent_server, "MAX_SERVERS", 1)
    marker, env = new_marker()
    runs = [json.loads(torchrun(SERVED, nproc=1, args=[MARKER_ENV], echo=None, env={**env, **more}).outputs[0])
            for more in ({}, {}, {"PYTHONHASHSEED": "7"})]
    seeded = subprocess.run([sys.executable, "-c", "print(hash('partrain'))"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": "7"}).stdout
    assert all(run["marked"] for run in runs)
    assert runs[0]["cmdline"][1:] == ["-m", "partrain_edu.launcher.agent_server"]
    assert runs[0]["server"] == runs[1]["server"] != runs[2]["server"]
    assert runs[2]["hash"] == int(seeded)
    deadline = time.monotonic() + 10
    while processes.read(runs[0]["server"]) is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes.read(runs[0]["server"]) is None  # the first server, retired, has ended


def _exit_with_1():
    os._exit(1)


def _killed():
    os.kill(os.getpid(), signal.SIGKILL)


def test_torchrun_reports_every_forked_rank_that_failed_not_only_the_first_it_polled(monkeypatch, tmp_path):
    # Both ranks are dead before torchrun's first look: its fork path would name only the first it polls (rank 0,
    # whose exit 1 is a peer's consequence in a real run), and the diagnosis needs rank 1's SIGKILL to blame it.
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, api, start_processes

    from partrain_edu.launcher import agent

    monkeypatch.setattr(api.MultiprocessContext, "_poll", api.MultiprocessContext._poll)  # undone after the test
    agent.poll_forked_ranks_as_exec_ones()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    try:  # torchrun's start() installs its own handlers in this process: this worker's next tests need theirs
        ranks = start_processes("two", lambda rank: (_exit_with_1, _killed)[rank](), {0: (0,), 1: (1,)},
                                {0: {}, 1: {}}, DefaultLogsSpecs(log_dir=str(tmp_path)), start_method="fork")
        for process in ranks._pc.processes:
            process.join()
        result = ranks.wait(timeout=10)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert {rank: failure.exitcode for rank, failure in result.failures.items()} == {0: 1, 1: -signal.SIGKILL}


def test_show_rank_streams_only_that_rank_but_keeps_all_outputs():
    lines = []
    result = torchrun(ALL_REDUCE, nproc=2, show_rank=1, echo=lambda r, t: lines.append(r))
    assert lines == [1] and set(result.outputs) == {0, 1}


def test_cell_magic_puts_published_values_into_the_namespace(capsys):
    namespace = {}
    run_cell_magic("-n 2 --timeout 60 -- --lr 0.1", ALL_REDUCE, namespace)
    assert namespace == {"total": 3.0, "world": 2}
    assert "[rank 1] rank 1 of 2 sees 3; args ['--lr', '0.1']" in capsys.readouterr().out


def _fail(mode: str, timeout: float = 30):
    marker, env = new_marker()
    start = time.perf_counter()
    with pytest.raises(TorchrunError) as info:
        torchrun(FAILING, nproc=2, args=[mode], timeout=timeout, echo=None, env=env)
    elapsed = time.perf_counter() - start
    assert leftovers(marker) == [], "a rank outlived the failed launch"
    return info.value, elapsed


def test_a_raising_rank_surfaces_its_own_traceback():
    error, elapsed = _fail("raise")
    assert error.rank == 1 and not error.timed_out
    text = str(error)
    assert text.startswith("rank 1 failed")
    assert "in broken_layer" in text and "ValueError: weights of rank 1 have the wrong shape" in text
    assert "ChildFailedError" not in text and "torch/distributed" not in text
    assert elapsed < 20


def test_a_hanging_rank_ends_in_a_collective_timeout_that_names_it():
    error, elapsed = _fail("hang", timeout=40)
    assert error.timed_out and error.rank == 0
    assert "rank(s) [1] never got that far" in str(error)
    assert "did not make the same collective calls" in str(error)
    assert elapsed < 25  # 5 s collective timeout + start-up, long before the launcher's 40 s


def test_the_launcher_timeout_stops_a_rank_looping_outside_any_collective():
    # No collective is running, so only the launcher's wall-clock limit can stop it; rank 0 finished long before.
    marker, env = new_marker()
    spin = "import os\nif os.environ['RANK'] == '1':\n    while True:\n        pass\nprint('done')\n"
    start = time.perf_counter()
    with pytest.raises(TorchrunError) as info:
        torchrun(spin, nproc=2, timeout=15, echo=None, env=env)
    error, elapsed = info.value, time.perf_counter() - start
    assert error.timed_out and error.rank is None and error.outputs == {0: "done\n"}
    assert "timed out after 15 s" in str(error) and "Ranks still running: [1]" in str(error)
    assert "`%%torchrun --timeout N`" in str(error) and "timeout=None" in str(error)  # how to raise or lift it
    assert elapsed < 15 + 10 and leftovers(marker) == []


def test_a_rank_killed_by_a_signal_is_named():
    error, elapsed = _fail("kill")
    assert error.rank == 1 and "killed by signal SIGKILL" in str(error)
    assert elapsed < 20


def test_a_kernel_interrupt_kills_every_rank():
    marker, env = new_marker()
    timer = threading.Timer(6.0, _thread.interrupt_main)  # what the notebook's stop button does
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        torchrun(FAILING, nproc=2, args=["sleep"], echo=None, env=env)
    timer.cancel()
    assert leftovers(marker) == []


def test_two_launches_at_once_do_not_collide():
    results, errors = [], []

    def launch():
        try:
            results.append(torchrun(ALL_REDUCE, nproc=2, echo=None).published["total"])
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=launch) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert errors == [] and results == [3.0, 3.0]


@pytest.mark.parametrize("kwargs, words", [
    ({"nproc": 0}, "nproc must be"), ({"show_rank": 2}, "--rank 2 does not exist"),
    *[({"timeout": bad}, "timeout must be a positive, finite number of seconds.*None for no limit")
      for bad in (-1, 0, float("nan"), float("inf"), "soon")]])
def test_bad_launch_arguments(kwargs, words):
    with pytest.raises(ValueError, match=words):
        torchrun("print(1)", **{"nproc": 2, **kwargs})


def test_backend_option_reaches_the_ranks_and_one_rank_works():
    code = "from partrain_edu import runtime\nctx = runtime.init()\nruntime.publish('backend', ctx.backend)\n"
    result = torchrun(code, nproc=1, backend="gloo", echo=None)
    assert result.published == {"backend": "gloo"} and set(result.outputs) == set()


def test_each_node_s_saved_exit_codes_are_read_together(tmp_path):
    from partrain_edu.launcher.torchrun_main import exit_codes

    assert exit_codes(tmp_path) == {}   # no torchrun has reported a failure (yet)
    (tmp_path / "exit_codes.11.json").write_text(json.dumps({"0": 1, "1": -9}))
    (tmp_path / "exit_codes.12.json").write_text(json.dumps({"3": -15}))
    (tmp_path / "exit_codes.13.part").write_text("{")   # one being written: never read
    assert exit_codes(tmp_path) == {0: 1, 1: -9, 3: -15}


def test_a_peer_vanished_error_is_never_named_the_cause(tmp_path):
    from partrain_edu.launcher.diagnose.oneshot import failure
    from partrain_edu.launcher.output import Run

    run = Run(2, tmp_path, lambda rank, text: None, None)
    (tmp_path / "rank0.error").write_text(json.dumps({"rank": 0, "time": 1.0, "timed_out": False,
                                                      "traceback": "RuntimeError: Connection closed by peer"}))
    (tmp_path / "rank1.error").write_text(json.dumps({"rank": 1, "time": 1.2, "timed_out": True,
                                                      "traceback": "RuntimeError: Timed out waiting 5000ms"}))
    error = failure(run, 1)
    assert error.rank == 1 and error.timed_out and str(error).startswith("rank 1 failed (then rank(s) [0]")
