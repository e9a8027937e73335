"""The launcher: results, published values, and every way a rank can fail — each a clear error within seconds,
with nothing left running."""
import _thread
import json
import math
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

from partrain_edu.launcher import TorchrunError, start, torchrun
from partrain_edu.notebook.magics import run_cell_magic

MARKER_ENV = "PARTRAIN_TEST_MARKER"
# What only the forkserver does (Linux), skipped on the portable path (`make test` runs these files there too).
forkserver_only = pytest.mark.skipif(not start.forks(), reason="the portable path starts every rank afresh")


HELPERS = ("multiprocessing.forkserver import main", "multiprocessing.resource_tracker import main")


def _helper(proc) -> bool:
    """CPython's forkserver or resource tracker, which serve every launch of their process. The workers and ranks
    the forkserver forked show its command line too, but their parent is the forkserver (or a worker)."""
    cmdline = " ".join(proc.cmdline())
    parent = proc.parent()
    return any(h in cmdline for h in HELPERS) and not (parent and HELPERS[0] in " ".join(parent.cmdline()))


def leftovers(marker: str) -> list[int]:
    """Live processes (not zombies) of a launch that passed `env={MARKER_ENV: marker}`: those whose environment or
    command line holds `marker` (whatever session or parent they have now), and every process this test process
    started since `new_marker()` made it that is still running (forked ranks show their parent's environment),
    except CPython's helpers."""
    import psutil

    me = psutil.Process()
    since = _MARKED_AT.get(marker, math.inf) - 0.05  # psutil's start times are in clock ticks
    mine = {p for p in me.children(recursive=True) if p.create_time() >= since}
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == me.pid or proc.status() == psutil.STATUS_ZOMBIE or _helper(proc):
                continue
            marked = marker in " ".join(proc.cmdline()) or proc.environ().get(MARKER_ENV) == marker
            if marked or proc in mine:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


_MARKED_AT: dict[str, float] = {}


def new_marker() -> tuple[str, dict[str, str]]:
    marker = f"marker-{uuid.uuid4().hex}"
    _MARKED_AT[marker] = time.time()
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
    assert list(tmp_path.iterdir()) == []  # torch's agent's logs went with the run's folder, not to a torchelastic_*


FORKED = """
import ctypes, faulthandler, json, os, signal, sys
had = {m: m in sys.modules for m in ("torch", "torch._dynamo")}  # before this script imported anything
pdeathsig = ctypes.c_int(-1)
ctypes.CDLL(None).prctl(2, ctypes.byref(pdeathsig), 0, 0, 0)  # PR_GET_PDEATHSIG
print(json.dumps({**had, "own_session": os.getsid(0) == os.getppid(), "pdeathsig": pdeathsig.value,
                  "faulthandler": faulthandler.is_enabled(), "threads": int(__import__("torch").get_num_threads()),
                  "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL}), flush=True)
os._exit(0)  # no return to the wrapper: still a clean finish, as in a process of its own
"""


@forkserver_only
def test_ranks_are_forked_with_torch_loaded_and_start_as_processes_of_their_own():
    # torch and the compiler stack an optimizer's first step loads come from the forkserver (`launcher.warmup`);
    # each rank is forked by its worker (torchrun's), which leads a session of its own, and starts with the
    # defaults an exec'd interpreter has
    outputs = torchrun(FORKED, nproc=2, echo=None).outputs
    assert {r: json.loads(text) for r, text in outputs.items()} == {r: {
        "torch": True, "torch._dynamo": True, "own_session": True, "sigterm_default": True, "pdeathsig": 0,
        "faulthandler": False, "threads": 1} for r in range(2)}


SERVED = """
import sys
exec_d = "torch" not in sys.modules  # a forked rank has it from the forkserver
import json, os, psutil
rank = psutil.Process()
print(json.dumps({"forkserver": rank.parent().parent().pid, "hash": hash("partrain"), "exec_d": exec_d,
                  "marked": os.environ[sys.argv[1]]}), flush=True)
"""


@forkserver_only
def test_every_launch_forks_from_one_forkserver_unless_it_sets_what_an_interpreter_reads_at_start():
    # One helper per process: CPython's forkserver. A PYTHONHASHSEED (read when Python starts) of the launch's
    # own gets a rank exec'd afresh, which honours it; every rank sees the launch's environment.
    marker, env = new_marker()
    runs = [json.loads(torchrun(SERVED, nproc=1, args=[MARKER_ENV], echo=None, env={**env, **more}).outputs[0])
            for more in ({}, {}, {"PYTHONHASHSEED": "7"})]
    seeded = subprocess.run([sys.executable, "-c", "print(hash('partrain'))"], capture_output=True, text=True,
                            env={**os.environ, "PYTHONHASHSEED": "7"}).stdout
    assert all(run["marked"] == marker for run in runs)
    assert runs[0]["forkserver"] == runs[1]["forkserver"] == runs[2]["forkserver"]
    assert [run["exec_d"] for run in runs] == [False, False, True]
    assert runs[2]["hash"] == int(seeded)
    assert leftovers(marker) == []


SIMULTANEOUS = """
import os, signal, time
from partrain_edu import runtime
open(os.path.join(os.path.dirname(os.environ[runtime.PUBLISH_DIR_ENV]), f"ready{os.environ['RANK']}"), "w").close()
while len([n for n in os.listdir(os.path.dirname(os.environ[runtime.PUBLISH_DIR_ENV])) if n.startswith("ready")]) < 2:
    time.sleep(0.01)
if os.environ["RANK"] == "0":
    os._exit(1)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_every_failed_rank_s_exit_code_is_kept_not_only_the_first_torch_saw():
    # Both ranks end at the same moment: torch's agent reports only the first it polls (possibly rank 0, whose
    # exit 1 is a peer's consequence in a real run); each worker keeps its own rank's code, so rank 1's SIGKILL
    # is what the diagnosis blames.
    with pytest.raises(TorchrunError) as info:
        torchrun(SIMULTANEOUS, nproc=2, echo=None, timeout=60)
    assert info.value.rank == 1 and "killed by signal SIGKILL" in str(info.value)


def test_ranks_run_where_the_caller_is_at_launch_time(tmp_path, monkeypatch):
    torchrun("print(1)", nproc=1, echo=None)  # the forkserver, where there is one, starts here (the worker's cwd)
    monkeypatch.chdir(tmp_path)  # `%cd` in a notebook
    result = torchrun("import os\nprint(os.getcwd())", nproc=2, echo=None)
    assert result.outputs == {r: f"{tmp_path}\n" for r in range(2)}


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


def test_each_worker_s_saved_exit_code_is_read_together(tmp_path):
    from partrain_edu.launcher.nanny import exit_codes

    assert exit_codes(tmp_path) == {}   # no worker has seen its rank end (yet)
    (tmp_path / "rank0.exit").write_text("1")
    (tmp_path / "rank1.exit").write_text("-9")
    (tmp_path / "rank3.exit.tmp").write_text("-1")   # one being written: never read
    assert exit_codes(tmp_path) == {0: 1, 1: -9}


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
