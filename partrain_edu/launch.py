"""Run code on N ranks from a notebook: the `%%torchrun` cell magic and the `torchrun()` function.

    %load_ext partrain_edu
    %%torchrun -n 4 [--timeout 120] [--backend gloo] [--rank 0] [-- script args]

Both run `python -m torch.distributed.run --standalone --nproc-per-node N` — `--standalone` rendezvous on a
free port, so two notebooks launching at once never collide — with every rank wrapped by `partrain_edu._rank`
so that the launcher can:
- stream each rank's output live as `[rank k]` lines (and, in a notebook, keep a rank-ordered copy, so the
  saved output is the same on every run);
- turn a failure into one `TorchrunError` carrying the failing rank's own traceback (not torchrun's
  ChildFailedError wall);
- kill every rank on a timeout, a kernel interrupt or another rank's failure — nothing is left running;
- hand back the values ranks `runtime.publish`ed.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import queue
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from partrain_edu.runtime import BACKEND_ENV, DEFAULT_TIMEOUT_S, PUBLISH_DIR_ENV, TIMEOUT_ENV

RANK_LINE = re.compile(r"^\[rank (\d+)\] ?(.*)$")
KILL_GRACE_S = 3.0
# Errors a rank gets only because another rank died or gave up first (Gloo's and NCCL's wording).
CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")


@dataclass
class TorchrunResult:
    returncode: int
    outputs: dict[int, str]  # rank -> everything that rank printed (stdout and stderr)
    published: dict[str, Any]  # name -> value from `runtime.publish` on rank 0
    wall_s: float
    launcher_output: str = ""


class TorchrunError(RuntimeError):
    """A rank failed, died or hung. `rank` is the first rank that failed (None if none could be named)."""

    def __init__(self, message: str, rank: int | None, rank_traceback: str = "",
                 outputs: dict[int, str] | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank, self.rank_traceback, self.timed_out = rank, rank_traceback, timed_out
        self.outputs = outputs or {}

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own stack: the learner's error is the rank's.
        return [f"TorchrunError: {self}"]


@dataclass
class _Run:
    """The bookkeeping of one launch: output per rank, and what torchrun itself said."""

    nproc: int
    run_dir: Path
    echo: Callable[[int | None, str], None]
    show_rank: int | None
    outputs: dict[int, list[str]] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)

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

    def pids(self) -> list[int]:
        return [int(Path(p).read_text() or 0) for p in glob.glob(str(self.run_dir / "rank*.pid"))]


def _print_echo(rank: int | None, text: str) -> None:
    print(f"[rank {rank}] {text}", flush=True)


def torchrun(code_or_path: str | os.PathLike, nproc: int = 2, timeout: float | None = None,
             args: Sequence[str] = (), *, module: str | None = None, backend: str | None = None,
             show_rank: int | None = None, echo: Callable[[int | None, str], None] | None = _print_echo,
             env: dict[str, str] | None = None) -> TorchrunResult:
    """Run a script (a path, or source code as a string) or `module=` on `nproc` ranks under torchrun.

    Returns a `TorchrunResult`; raises `TorchrunError` when any rank fails or the run exceeds `timeout`
    seconds (None: no limit beyond the 60 s collective timeout inside the ranks).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    if timeout is not None and timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    if show_rank is not None and not 0 <= show_rank < nproc:
        raise ValueError(f"--rank {show_rank} does not exist with {nproc} ranks; pick 0..{nproc - 1}")
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
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc-per-node={nproc}", "-m", "partrain_edu._rank", str(run_dir)]
        collective_timeout = DEFAULT_TIMEOUT_S if timeout is None else min(DEFAULT_TIMEOUT_S, 0.75 * timeout)
        rank_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    PUBLISH_DIR_ENV: str(run_dir / "published"), TIMEOUT_ENV: str(collective_timeout)}
        if backend is not None:
            rank_env[BACKEND_ENV] = backend
        run = _Run(nproc, run_dir, echo or (lambda rank, text: None), show_rank)
        returncode, wall_s = _supervise(command, rank_env, run, timeout)
        if returncode != 0:
            raise _failure(run, returncode)
        published = {}
        for path in sorted((run_dir / "published").glob("*.pkl")):
            with open(path, "rb") as f:
                published[path.stem] = pickle.load(f)
        return TorchrunResult(returncode, run.texts(), published, wall_s, "\n".join(run.launcher))


def _supervise(command: list[str], env: dict[str, str], run: _Run, timeout: float | None) -> tuple[int, float]:
    """Start torchrun, route its merged output line by line, and kill everything on timeout or interrupt."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, bufsize=1, start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line.rstrip("\n"))
        lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    deadline = None if timeout is None else start + timeout
    try:
        while True:
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.perf_counter()))
            try:
                line = lines.get(timeout=wait)
            except queue.Empty:
                if deadline is not None and time.perf_counter() >= deadline:
                    _kill_all(proc, run)
                    _drain(lines, run)
                    raise _timeout_error(run, timeout)
                continue
            if line is None:
                break
            run.take(line)
        proc.wait()
    except BaseException:  # KeyboardInterrupt (kernel interrupt) or our own TorchrunError
        _kill_all(proc, run)
        raise
    if proc.returncode != 0:
        _kill_all(proc, run)  # torchrun stops the other ranks itself; make sure, then verify nothing remains
    return proc.returncode, time.perf_counter() - start


def _drain(lines: queue.Queue, run: _Run) -> None:
    while True:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            return
        if line is None:
            return
        run.take(line)


def _kill_all(proc: subprocess.Popen, run: _Run) -> None:
    """SIGTERM torchrun's group and every rank (each rank is in its own session), then SIGKILL leftovers."""
    victims = [proc.pid, *run.pids()]
    def running() -> bool:
        return proc.poll() is None or any(_alive(pid) for pid in victims[1:])

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in victims:
            try:
                if pid == proc.pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.perf_counter() + KILL_GRACE_S
        while time.perf_counter() < end and running():
            time.sleep(0.05)
        if not running():
            return


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by torchrun) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return True


def _failure(run: _Run, returncode: int) -> TorchrunError:
    """Name the rank whose failure caused the others', show its traceback, and list the ranks left stuck."""
    errors = {e["rank"]: e for e in (json.loads(p.read_text()) for p in run.run_dir.glob("rank*.error"))}
    exit_codes = _torchrun_exit_codes("\n".join(run.launcher))
    outputs = run.texts()
    # A rank killed by a signal (OOM killer, segfault, kill -9) writes no error; the others then fail only
    # because it vanished ("connection closed by peer"), so it is the cause, whichever failure torchrun saw
    # first. SIGTERM is torchrun's own clean-up of the survivors, a cause only when nobody raised.
    killed = [(rank, code) for rank, code in exit_codes.items() if code < 0 and rank not in errors
              and not (code == -signal.SIGTERM and errors)]
    if killed:
        rank, code = min(killed)
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        last = outputs.get(rank, "").strip().splitlines()[-5:]
        tail = ("\nits last lines:\n" + "\n".join(last)) if last else ""
        return TorchrunError(f"rank {rank} was killed by signal {name} before raising a Python error; "
                             f"the other ranks were stopped{tail}", rank, "", outputs)
    if not errors:
        return TorchrunError(f"torchrun exited with code {returncode} and no rank reported an error:\n"
                             + "\n".join(run.launcher[-20:]), min(exit_codes, default=None), "", outputs)
    # The earliest error is the cause, except that a rank whose peer vanished ("connection closed/reset by
    # peer") is only a consequence: the peer's own error (often a timeout) can be written a moment later.
    first = min(errors.values(), key=lambda e: (_is_consequence(e["traceback"]), e["time"]))
    others = sorted(r for r in errors if r != first["rank"])
    also = f" (then rank(s) {others} failed too)" if others else ""
    stuck = _stuck_ranks(run)
    if first["timed_out"] and stuck:
        also += f"; rank(s) {stuck} never got that far"
    message = f"rank {first['rank']} failed{also}:\n{first['traceback'].rstrip()}"
    return TorchrunError(message, first["rank"], first["traceback"], outputs, first["timed_out"])


def _is_consequence(traceback_text: str) -> bool:
    return any(words in traceback_text for words in CONSEQUENCES)


def _torchrun_exit_codes(report: str) -> dict[int, int]:
    """{rank: exit code} of every failed rank in torchrun's ChildFailedError report ("rank : 1 ..." then
    "exitcode : -9 ..." in each block)."""
    blocks = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", report)
    return {int(rank): int(code) for rank, code in blocks}


def _stuck_ranks(run: _Run) -> list[int]:
    """Ranks that started but neither finished nor raised: where a deadlock usually is."""
    def ranks(suffix: str) -> set[int]:
        return {int(p.name[4:-len(suffix)]) for p in run.run_dir.glob(f"rank*{suffix}")}

    return sorted(ranks(".pid") - ranks(".error") - ranks(".done"))


def _timeout_error(run: _Run, timeout: float | None) -> TorchrunError:
    stuck = _stuck_ranks(run) or list(range(run.nproc))
    message = (f"timed out after {timeout:g} s; every rank was killed. Ranks still running: {stuck}. "
               "A rank that never reaches a collective the others wait in (a different order, a missing call, "
               "an endless loop) is the usual cause.")
    return TorchrunError(message, None, "", run.texts(), timed_out=True)


def run_cell_magic(line: str, cell: str, user_ns: dict[str, Any]) -> TorchrunResult:
    """`%%torchrun -n N [--timeout S] [--backend B] [--rank R] [-- args]` — see the module docstring."""
    import argparse

    from partrain_edu.notebook import LiveOutput

    parser = argparse.ArgumentParser(prog="%%torchrun", add_help=False, exit_on_error=False)
    parser.add_argument("-n", "--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default=None)
    parser.add_argument("--rank", type=int, default=None)
    words = shlex.split(line)
    script_args = words[words.index("--") + 1:] if "--" in words else []
    options = parser.parse_args(words[:words.index("--")] if "--" in words else words)
    live = LiveOutput(show_rank=options.rank)
    try:
        result = torchrun(cell, nproc=options.nproc, timeout=options.timeout, args=script_args,
                          backend=options.backend, show_rank=options.rank, echo=live.line)
    except TorchrunError as error:
        live.finish(error.outputs)
        raise
    live.finish(result.outputs)
    user_ns.update(result.published)
    return result


def load_ipython_extension(ipython) -> None:
    def torchrun_magic(line: str, cell: str) -> None:
        run_cell_magic(line, cell, ipython.user_ns)

    ipython.register_magic_function(torchrun_magic, magic_kind="cell", magic_name="torchrun")
