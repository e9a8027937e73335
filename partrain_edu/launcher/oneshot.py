"""Run code on N ranks from a notebook: the `%%torchrun` cell magic (see `partrain_edu.notebook`) and `torchrun()`.

    %load_ext partrain_edu
    %%torchrun -n 4 [--timeout 120|none] [--backend gloo] [--rank 0] [-- script args]

Both run torch's own agent, the one torchrun runs (`launcher.start`), on a fresh loopback rendezvous, each rank
wrapped by `launcher.rank`. So the launcher streams each rank's output live as `[rank k]` lines; turns a failure
into one `TorchrunError` naming the rank that caused it, with its own traceback (`diagnose`); stops the run after
`timeout` seconds (default 300 s), on the stop button (`TorchrunInterrupted`), on a rank's failure, on a collective
mismatch, or when the caller dies, killing every rank and all they started (`supervise`); and hands back what rank 0
`runtime.publish`ed.
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from partrain_edu.launcher.diagnose.oneshot import TorchrunError, failure, mismatch_error, timeout_error
from partrain_edu.launcher.options import (
    DEFAULT_RUN_TIMEOUT_S,
    check_arguments,
    check_timeout,
    rank_environment,
    script_path,
)
from partrain_edu.launcher.output import Run, TorchrunResult, print_echo
from partrain_edu.launcher.start import Launch
from partrain_edu.launcher.status_line import RankStatus, in_kernel
from partrain_edu.launcher.supervise import supervise
from partrain_edu.runtime import read_published

T = TypeVar("T")


def torchrun(code_or_path: str | os.PathLike, nproc: int = 2, timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
             args: Sequence[str] = (), *, module: str | None = None, backend: str | None = None,
             show_rank: int | None = None, echo: Callable[[int | None, str], None] | None = print_echo,
             env: dict[str, str] | None = None, started: Callable[[int], None] | None = None) -> TorchrunResult:
    """Run a script (a path, or source code) or `module=` on `nproc` ranks under torch's agent: a
    `TorchrunResult`, or `TorchrunError` when a rank fails or the run takes over `timeout` s (None: no limit; a
    collective's deadlock still ends after 60 s). `started(k)`: k ranks have started; without it, a notebook shows
    the ranks' own status line ("starting 2 ranks… 3 s", `status_line`)."""
    timeout = check_arguments(nproc, timeout, show_rank)
    if started is None and in_kernel():  # `torchrun(...)` called from a notebook cell: no wait without a line
        with RankStatus(nproc, timeout) as status:
            return torchrun(code_or_path, nproc, timeout, args, module=module, backend=backend, show_rank=show_rank,
                            echo=echo, env=env, started=status.started)
    with tempfile.TemporaryDirectory(prefix="partrain_") as tmp:
        run_dir = Path(tmp)
        (run_dir / "published").mkdir()
        script = None if module is not None else script_path(code_or_path, run_dir, "torchrun_cell.py")
        target = ["--module", module] if module is not None else [script]
        (run_dir / "argv.json").write_text(json.dumps([*target, *map(str, args)]))
        run = Run(nproc, run_dir, echo or (lambda rank, text: None), show_rank)
        rank_env = rank_environment(run.run_id, run_dir / "published", timeout, env, backend)
        outcome = supervise(lambda env: [Launch(run, "partrain_edu.launcher.rank", env)], rank_env, run, timeout,
                            started)
        if outcome.timed_out:
            raise timeout_error(run, timeout)
        if outcome.mismatch is not None:
            raise mismatch_error(run, outcome.mismatch)
        returncode, wall_s = outcome.returncodes[0], outcome.wall_s
        if returncode != 0:
            raise failure(run, returncode)
        published = read_published(run_dir / "published")
        return TorchrunResult(returncode, run.texts(), published, wall_s, "\n".join(run.launcher))


def call_with_timeout(fn: Callable[[], T], timeout: float | None) -> T:
    """`fn()` in this process, stopped with a `TorchrunError(timed_out=True)` after `timeout` s (None: no limit):
    the launcher's limit for a world of one, which stays in process. SIGALRM: the main thread only, and it stops at
    the next Python line (one long C call, a huge matmul, finishes first)."""
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
