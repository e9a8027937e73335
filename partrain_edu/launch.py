"""Run code on N ranks from a notebook: the `%%torchrun` cell magic (see `partrain_edu.notebook`) and `torchrun()`.

    %load_ext partrain_edu
    %%torchrun -n 4 [--timeout 120|none] [--backend gloo] [--rank 0] [-- script args]

Both run torch's `torch.distributed.run` (through `partrain_edu._agent`) with a fresh rendezvous on a free port
of 127.0.0.1, so two notebooks launching at once never collide and nothing listens beyond this machine. Every
rank is wrapped by `partrain_edu._rank`, so that the launcher can:
- stream each rank's output live as `[rank k]` lines (and, in a notebook, keep a rank-ordered copy, so the
  saved output is the same on every run);
- turn a failure into one `TorchrunError` naming the rank that caused it, with its own traceback (not
  torchrun's ChildFailedError wall);
- stop the run after `timeout` seconds of wall-clock time (default 300 s), on a kernel interrupt (one line:
  `TorchrunInterrupted`), on another rank's failure, as soon as the ranks' call records show a collective
  mismatch (`partrain_edu._call_findings`), or when the caller itself dies, killing every rank and all they started;
- hand back the values ranks `runtime.publish`ed.
"""
from __future__ import annotations

import json
import math
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from partrain_edu import _call_findings, _cgroup, _procs
from partrain_edu._diagnose import (RANK_DEBUG_ENV, TorchrunError, TorchrunInterrupted, failure, mismatch_error,
                                    timeout_error)
from partrain_edu.runtime import BACKEND_ENV, DEFAULT_TIMEOUT_S, PUBLISH_DIR_ENV, TIMEOUT_ENV

# A cell that runs longer than this is stopped. It catches what the 60 s collective timeout inside the ranks
# cannot (a loop with no collective, a rank blocked outside torch) while leaving ample room for a healthy cell on a
# loaded classroom server: course cells take seconds, and 20 concurrent 2-rank trainings on 2 cores took 260 s.
DEFAULT_RUN_TIMEOUT_S = 300.0
RANK_LINE = re.compile(r"^\[rank (\d+)\] ?(.*)$")
KILL_GRACE_S = 3.0
T = TypeVar("T")


@dataclass
class TorchrunResult:
    returncode: int
    outputs: dict[int, str]  # rank -> everything that rank printed (stdout and stderr)
    published: dict[str, Any]  # name -> value from `runtime.publish` on rank 0
    wall_s: float
    launcher_output: str = ""


@dataclass
class _Run:
    """The bookkeeping of one launch: output per rank, and what torchrun itself said."""

    nproc: int
    run_dir: Path
    echo: Callable[[int | None, str], None]
    show_rank: int | None
    outputs: dict[int, list[str]] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cgroup: str | None = None  # the run's cgroup, where one could be made (_cgroup.py)

    def take(self, line: str) -> None:
        match = RANK_LINE.match(line)
        if match is None:
            self.launcher.append(line)  # torchrun's logging: kept for the error message, not shown
            return
        rank, text = int(match.group(1)), match.group(2)
        self.outputs.setdefault(rank, []).append(text)
        if self.show_rank is None or rank == self.show_rank:
            self.echo(rank, text)

    def texts(self) -> dict[int, str]:
        return {r: "\n".join(lines) + "\n" for r, lines in sorted(self.outputs.items())}

    def ranks_with(self, suffix: str) -> set[int]:
        """Ranks that wrote RUN_DIR/rank{k}{suffix}: .pid started, .error raised, .done finished cleanly."""
        return {int(p.name[4:-len(suffix)]) for p in self.run_dir.glob(f"rank*{suffix}")}


def _print_echo(rank: int | None, text: str) -> None:
    print(f"[rank {rank}] {text}", flush=True)


def check_timeout(timeout: Any, name: str = "timeout", none: str = "None") -> float | None:
    """`timeout` as seconds, or None for no limit; a one-line ValueError naming `name` for anything else."""
    if timeout is None:
        return None
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(timeout, bool) or not (0 < seconds < math.inf):
        raise ValueError(f"{name} must be a positive, finite number of seconds, not {timeout!r} "
                         f"({none} for no limit)")
    return seconds


def check_arguments(nproc: int, timeout: Any, show_rank: int | None) -> float | None:
    if nproc < 1:
        raise ValueError(f"nproc must be a whole number of at least 1, not {nproc!r}")
    if show_rank is not None and not 0 <= show_rank < nproc:
        raise ValueError(f"--rank {show_rank} does not exist with {nproc} ranks; pick 0..{nproc - 1}")
    return check_timeout(timeout)


def torchrun(code_or_path: str | os.PathLike, nproc: int = 2, timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
             args: Sequence[str] = (), *, module: str | None = None, backend: str | None = None,
             show_rank: int | None = None, echo: Callable[[int | None, str], None] | None = _print_echo,
             env: dict[str, str] | None = None, started: Callable[[int], None] | None = None) -> TorchrunResult:
    """Run a script (a path, or source code as a string) or `module=` on `nproc` ranks under torchrun.

    Returns a `TorchrunResult`; raises `TorchrunError` when any rank fails, or when the run takes longer than
    `timeout` seconds (default 300; None: no limit, a deadlock in a collective still ends after 60 s).
    `started(k)` is told each time the number of ranks whose process has started grows (`status_line.py`).
    """
    timeout = check_arguments(nproc, timeout, show_rank)
    with tempfile.TemporaryDirectory(prefix="partrain_") as tmp:
        run_dir = Path(tmp)
        (run_dir / "published").mkdir()
        if module is not None:
            target = ["--module", module]
        elif isinstance(code_or_path, os.PathLike) or (
                str(code_or_path).endswith(".py") and "\n" not in str(code_or_path)):
            if not Path(code_or_path).is_file():
                raise FileNotFoundError(f"no such script: {code_or_path}")
            target = [str(Path(code_or_path).resolve())]
        else:
            script = run_dir / "torchrun_cell.py"
            script.write_text(str(code_or_path))
            target = [str(script)]
        # The script and its arguments travel in a file: torchrun's own parser would otherwise claim any
        # script flag that abbreviates one of its options (`--nproc` for `--nproc-per-node`).
        (run_dir / "argv.json").write_text(json.dumps([*target, *map(str, args)]))
        run = _Run(nproc, run_dir, echo or (lambda rank, text: None), show_rank)
        command = [sys.executable, "-m", "partrain_edu._agent", str(os.getpid()),
                   "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={run.run_id}",
                   "--nnodes=1", "--local-addr=127.0.0.1", f"--nproc-per-node={nproc}",
                   "-m", "partrain_edu._rank", str(run_dir)]
        collective_timeout = DEFAULT_TIMEOUT_S if timeout is None else min(DEFAULT_TIMEOUT_S, 0.75 * timeout)
        rank_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    PUBLISH_DIR_ENV: str(run_dir / "published"), TIMEOUT_ENV: str(collective_timeout),
                    _procs.RUN_ENV: run.run_id, _procs.LAUNCHER_ENV: _procs.identity(os.getpid()) or ""}
        if os.path.exists("/sys/class/net/lo"):  # Gloo's own sockets on loopback too (single node)
            rank_env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        for name, value in RANK_DEBUG_ENV.items():  # the caller's own setting wins (DETAIL for one run)
            rank_env.setdefault(name, value)
        if backend is not None:
            rank_env[BACKEND_ENV] = backend
        returncode, wall_s = _supervise(command, rank_env, run, timeout, started)
        if returncode != 0:
            raise failure(run, returncode)
        published = {}
        for path in sorted((run_dir / "published").glob("*.pkl")):
            with open(path, "rb") as f:
                published[path.stem] = pickle.load(f)
        return TorchrunResult(returncode, run.texts(), published, wall_s, "\n".join(run.launcher))


def _supervise(command: list[str], env: dict[str, str], run: _Run, timeout: float | None,
               started: Callable[[int], None] | None = None) -> tuple[int, float]:
    """Start torchrun, route its merged output line by line, and stop everything on timeout or interrupt.

    It ends when torchrun exits, not when its output pipe closes: a child a rank left running may hold the pipe
    open forever (it is killed here, then what is left in the pipe is read)."""
    start = time.perf_counter()
    run.cgroup = _cgroup.create(run.run_id)  # where allowed: what escapes the /proc scan stays in it (_cgroup.py)
    env = {**env, _cgroup.ENV: run.cgroup} if run.cgroup else env
    # A session of its own: Ctrl-C in a terminal reaches only this process, which then stops the run itself.
    try:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        _cgroup.kill(run.cgroup)
        raise
    lines = _Lines(proc.stdout.fileno(), run.take)  # type: ignore[union-attr]
    deadline = None if timeout is None else start + timeout
    timed_out, mismatch, watch = False, None, _call_findings.Watch(run.run_dir, run.nproc)
    up = 0
    try:
        while proc.poll() is None and not timed_out and mismatch is None:
            left = None if deadline is None else deadline - time.perf_counter()
            timed_out = left is not None and left <= 0
            lines.read(0.1 if left is None else max(0.0, min(0.1, left)))
            mismatch = watch.poll()  # ranks that wait in mismatched collectives wait for ever: stop them now
            if started is not None and up < run.nproc and (now_up := len(run.ranks_with(".pid"))) > up:
                up = now_up
                started(up)
        _stop(proc, run)  # torchrun has exited, time is up or the ranks can never finish: what still runs must go
        lines.drain(KILL_GRACE_S)
    except KeyboardInterrupt:  # the stop button: one line for the learner, once every rank is gone
        _stop(proc, run)
        raise TorchrunInterrupted(run.nproc, time.perf_counter() - start, run.texts()) from None
    except BaseException:  # SystemExit (a signal handler), an error in the launcher itself
        _stop(proc, run)
        raise
    finally:
        proc.stdout.close()  # type: ignore[union-attr]
    if timed_out:
        raise timeout_error(run, timeout)
    if mismatch is not None:
        raise mismatch_error(run, mismatch)
    return proc.returncode, time.perf_counter() - start


class _Lines:
    """torchrun's merged output as lines, read without blocking for longer than asked and without trusting its
    bytes to be UTF-8 (a rank may write anything to its stdout)."""

    def __init__(self, fd: int, take: Callable[[str], None]):
        self.fd, self.take, self.pending, self.eof = fd, take, b"", False
        self.poller = select.poll()  # not select(): a long-lived kernel may hold more than 1024 descriptors
        self.poller.register(fd, select.POLLIN)

    def read(self, wait_s: float) -> None:
        if self.eof:
            time.sleep(wait_s)
            return
        if not self.poller.poll(wait_s * 1000):
            return
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.eof, chunk = True, b"\n" if self.pending else b""
        *complete, self.pending = (self.pending + chunk).split(b"\n")
        for line in complete:
            self.take(line.decode("utf-8", errors="replace"))

    def drain(self, grace_s: float) -> None:
        """Read what is left, until the pipe closes or `grace_s` seconds have passed."""
        end = time.monotonic() + grace_s
        while not self.eof and (left := end - time.monotonic()) > 0:
            self.read(min(0.1, left))


def _stop(proc: subprocess.Popen, run: _Run) -> None:
    """End torchrun, every rank and everything they started: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    if proc.poll() is None:
        proc.terminate()  # Popen never signals a PID it has already reaped
    _procs.stop(lambda: _procs.run_members(run.run_id), KILL_GRACE_S)
    _cgroup.kill(run.cgroup)  # what the scan cannot find: a double-forked, setsid, env={} child
    try:
        proc.wait(KILL_GRACE_S)
    except subprocess.TimeoutExpired:  # only without /proc, where the scan above finds nothing
        proc.kill()
        proc.wait()


def call_with_timeout(fn: Callable[[], T], timeout: float | None) -> T:
    """`fn()` in this process, stopped with a `TorchrunError(timed_out=True)` after `timeout` seconds of wall-clock
    time (None: no limit): the launcher's limit, for runs that stay in process (a world of one).

    Uses SIGALRM, so it needs the main thread, and it stops at the next Python line: a single long C call
    (one huge matmul) finishes first."""
    timeout = check_timeout(timeout)
    if timeout is None:
        return fn()
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("a timeout on an in-process run needs the main thread; call it there or pass timeout=None")

    def expire(signum: int, frame: Any) -> None:
        raise TorchrunError(f"timed out after {timeout:g} s and was stopped. If the run is just slow, raise the "
                            "limit (`--timeout N`, `timeout=N`; None: no limit).", None, timed_out=True)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# The cell magic lives with the notebook display; importable from here as before.
from partrain_edu.notebook import load_ipython_extension, run_cell_magic  # noqa: E402
