"""Warm ranks: N processes started once that run cell after cell, keeping their variables (`%dist`, `%%dist`).

    with Pool(2) as pool:                       # in a notebook:  %dist start -n 2
        pool.run("x = rank * 10")               #                 %%dist
        pool.run("print(x)", rank=1)            #                 %%dist --rank 1
        pool.run("runtime.publish('y', x)")     # .published == {"y": 0}, rank 0's value; %%dist sets y
The ranks start as one-shot ranks do (`launcher.start`: nothing outlives the kernel) and run `warm.rank_loop`,
whose namespace starts with PRELUDE. Each cell's code goes through the run's loopback store (`warm.link`); each rank
answers "done" (or its error) after writing the cell's end mark into its output. A rank that raises leaves the pool
usable, unless the others are still stuck GRACE_S later. A rank that dies, a timeout, ranks whose call records show
they would wait for ever (`diagnose.findings`) or that ignore the stop button bring the pool down, every process
killed, with an error that says `%dist restart`.
"""
from __future__ import annotations

import atexit
import contextlib
import shutil
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from partrain_edu.launcher import nanny
from partrain_edu.launcher.diagnose import findings
from partrain_edu.launcher.diagnose import warm as diagnosis
from partrain_edu.launcher.diagnose.warm import RESTART, Cell, DistError, DistInterrupted
from partrain_edu.launcher.options import DEFAULT_RUN_TIMEOUT_S, check_arguments, check_timeout, rank_environment
from partrain_edu.launcher.output import Run, TorchrunResult, print_echo
from partrain_edu.launcher.warm.link import MARK_PREFIX, Link
from partrain_edu.runtime import read_published

__all__ = ["Pool", "DistError", "DistInterrupted", "PRELUDE"]
PRELUDE = """\
import torch
import torch.distributed as dist
from partrain_edu import runtime
ctx = runtime.init()
rank, world_size = ctx.rank, ctx.world_size
runtime.publish("backend", ctx.backend)
"""
GRACE_S = 3.0  # after one rank raised, or after the stop button: how long the others may take to end their cell
REPORT_WAIT_S = 5.0  # a rank died: how long torch's agent may take to stop the others (their exit codes saved)
STOP_WAIT_S = 10.0  # `stop()`: how long the ranks may take to tear down their process group and exit
# How often the kernel looks for the ranks' answers: every 10 ms in a cell's first second (most cells are quicker),
# then every 50 ms (looking every 10 ms cost the kernel 4.4% of a core through a 5 s cell here).
QUICK_S = 0.01
QUICK_FOR_S = 1.0
POLL_S = 0.05


class Pool:
    """`nproc` warm ranks. `timeout`: each cell's default limit in seconds (None: none); see the module's doc."""

    def __init__(self, nproc: int = 2, *, backend: str | None = None, timeout: float | None = DEFAULT_RUN_TIMEOUT_S,
                 env: dict[str, str] | None = None, echo: Callable[[int | None, str], None] | None = print_echo,
                 started: Callable[[int], None] | None = None):
        self.timeout = check_arguments(nproc, timeout, None)
        self.nproc = nproc
        self.requested_backend = backend
        self.env = dict(env or {})
        self.echo = echo or (lambda rank, text: None)
        self.up = False
        self.backend = ""
        self.cells_run = 0
        self._link = None
        self.start(started)

    def start(self, started: Callable[[int], None] | None = None) -> None:
        """Start the ranks and run PRELUDE (DistError if that fails); `started(k)`: k ranks have started."""
        if self.up:
            raise RuntimeError("the warm ranks are running already; restart() replaces them")
        self.dir = Path(tempfile.mkdtemp(prefix="partrain_warm_"))  # mode 0700: its files are ours alone
        (self.dir / "published").mkdir()
        self.run_id = uuid.uuid4().hex
        self.cells_run = 0
        self.started_at = time.monotonic()
        self.up = True
        self._link = None
        _LIVE[id(self)] = self
        try:
            run = Run(self.nproc, self.dir, self.echo, None, run_id=self.run_id)
            env = rank_environment(self.run_id, self.dir / "published", self.timeout, self.env, self.requested_backend)
            self._link = Link(run, env)
            self._accept(started)
            prelude = self._run(PRELUDE, None, self.timeout, self.echo)
            self.backend, self.start_outputs = prelude.published["backend"], prelude.outputs
        except BaseException as error:
            self._kill()
            if isinstance(error, DistError):
                error.args = (f"the warm ranks could not start: {error}",)
            raise

    def _accept(self, started: Callable[[int], None] | None) -> None:
        """Wait until every rank has started (its .pid file)."""
        link, deadline = self._link, None if self.timeout is None else time.monotonic() + self.timeout
        while len(link.pids()) < self.nproc:
            if not link.alive():
                said = link.launcher[-20:] + [f"[rank {r}] {t}" for r, ts in link.pending.items() for t in ts]
                raise DistError("torch's agent ended before every rank was up; it said:\n" + "\n".join(said), None, {},
                                pool_stopped=True)
            if deadline is not None and time.monotonic() > deadline:
                raise DistError(f"the ranks were not up within {self.timeout:g} s", None, {}, timed_out=True,
                                pool_stopped=True)
            link.pump(0.05)
            if started is not None:
                started(len(link.pids()))

    def run(self, code: str, rank: int | None = None, timeout: Any = "pool",
            echo: Callable[[int | None, str], None] | None = None, name: str | None = None) -> TorchrunResult:
        """Run `code` on every rank (or on `rank`) within `timeout` s (default: the pool's; None: none); `name`
        is the cell's in the ranks' tracebacks (`<dist In[27]>`; default `<dist cell N>`). Returns a
        TorchrunResult with rank 0's `published`; raises DistError or DistInterrupted."""
        if not self.up:
            raise DistError(f"the warm ranks are not running. {RESTART}", None, {}, pool_stopped=True)
        check_arguments(self.nproc, None, rank)
        timeout = self.timeout if timeout == "pool" else check_timeout(timeout)
        self.cells_run += 1
        return self._run(code, rank, timeout, echo or self.echo, name)

    def _run(self, code: str, rank: int | None, timeout: float | None, echo: Callable,
             name: str | None = None) -> TorchrunResult:
        link = self._link
        cell = Cell(self.cells_run, list(range(self.nproc)) if rank is None else [rank],
                    MARK_PREFIX + uuid.uuid4().hex, echo)
        for r in cell.ranks:  # what a rank wrote after its last cell's end mark belongs to this one
            for text in link.pending.pop(r, []):
                cell.show(r, text)
        link.cell = cell
        start = time.monotonic()
        ok = False
        try:
            with _stop_button() as presses:
                for r in cell.ranks:
                    link.send(r, {"op": "run", "cell": cell.number, "name": name, "code": code, "mark": cell.mark})
                self._wait(cell, None if timeout is None else start + timeout, timeout, presses)
            ok = True
        finally:
            link.cell = None
            # rank 0's `runtime.publish` files: read after a cell that succeeded, dropped otherwise
            published = read_published(self.dir / "published") if ok else {}
            for path in self.dir.glob("published/*.pkl"):
                path.unlink()
        return TorchrunResult(0, cell.texts(), published, time.monotonic() - start)

    def _wait(self, cell: Cell, deadline: float | None, timeout: float | None, presses: list[int]) -> None:
        """Route output and answers until every rank of `cell` is done; raise when the cell failed."""
        grace_end = interrupted = None
        began = time.monotonic()
        watch = findings.Watch(self.dir, self.nproc, ended=True)  # also: waiting for ranks that ended it
        while not cell.finished(now := time.monotonic()):
            if not self._link.alive():
                self._died(cell)
            if presses[0] and interrupted is None:  # the stop button: pass it on to every rank still running
                interrupted = presses[0]
                self._link.signal(cell.running(), signal.SIGINT)
                grace_end = now + GRACE_S
            if presses[0] and presses[0] != interrupted:  # pressed again: stop waiting for them
                grace_end = now
            if cell.errors() and grace_end is None:
                grace_end = now + GRACE_S  # the others may be waiting for the raising rank in a collective
            if grace_end is not None and now > grace_end and cell.running():
                self._kill()
                if interrupted is not None:
                    raise diagnosis.stuck_after_interrupt(cell, GRACE_S)
                raise diagnosis.stuck_after_raise(cell, GRACE_S)
            if deadline is not None and now > deadline:
                calls = self._calls(cell)
                self._kill()
                raise diagnosis.timed_out(cell, timeout, calls)
            if (found := watch.poll(cell.finished_cleanly())) is not None:  # they would wait until the timeout
                # (a mismatch, or ranks in a collective that members who ended the cell will never join)
                self._kill()
                raise diagnosis.mismatch(cell, found)
            self._link.pump(QUICK_S if now - began < QUICK_FOR_S else POLL_S)
        if interrupted is not None:
            raise diagnosis.interrupted(cell)
        if cell.errors():
            raise diagnosis.failed(cell, calls=self._calls(cell))

    def _calls(self, cell: Cell) -> findings.Finding | None:
        """Where the ranks' call records say they wait (read before `_kill` removes them)."""
        return findings.diagnose(self.dir, self.nproc, cell.finished_cleanly())

    def _died(self, cell: Cell) -> None:
        """A rank's process ended: let torch's agent stop the others (their exit codes saved), stop all, name it."""
        end = time.monotonic() + REPORT_WAIT_S
        while self._link.proc.poll() is None and time.monotonic() < end:
            self._link.pump(0.05)
        self._link.tail.read()  # the last lines the ranks wrote
        codes = nanny.exit_codes(self.dir)
        calls = self._calls(cell)
        self._kill()
        raise diagnosis.died(cell, codes, self._link.proc.returncode, calls)

    def _kill(self) -> None:
        """Kill every process of the pool and remove its folder."""
        self.up = False
        _LIVE.pop(id(self), None)
        if self._link is not None:
            self._link.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def stop(self) -> None:
        """End the ranks; nothing of the pool is left running afterwards. Safe to call twice."""
        if self.up:
            self._link.hang_up(self.nproc, STOP_WAIT_S)
            self._kill()

    def restart(self) -> None:
        self.stop()
        self.start()

    def status(self) -> dict[str, Any]:
        pids = {r: p.pid for r, p in sorted(self._link.pids().items())} if self.up else {}
        return {"up": self.up, "ranks": self.nproc, "backend": self.backend, "cells_run": self.cells_run,
                "pids": pids, "uptime_s": round(time.monotonic() - self.started_at, 1) if self.up else 0.0}

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.stop()


_LIVE: dict[int, Pool] = {}  # every pool still up, held here so that none is forgotten with its ranks running
atexit.register(lambda: [pool.stop() for pool in list(_LIVE.values())])  # a kernel restart or shutdown


@contextlib.contextmanager
def _stop_button():
    """Count SIGINTs (the stop button) while a cell runs, instead of a KeyboardInterrupt amid the bookkeeping.
    Only the main thread receives signals; elsewhere the count stays 0."""
    presses = [0]
    if threading.current_thread() is not threading.main_thread():
        yield presses
        return

    def press(signum: int, frame: Any) -> None:
        presses[0] += 1

    previous = signal.signal(signal.SIGINT, press)
    try:
        yield presses
    finally:
        signal.signal(signal.SIGINT, previous)
