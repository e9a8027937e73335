"""What happened in one warm cell (`launcher.warm.pool`), and when it went wrong, the one error that says so.

A cell's bookkeeping (`Cell`): which ranks run it, what each printed, which answered "done" (with their error report,
if any) and which wrote the end mark that closes their output. The errors are told with `diagnose.oneshot`'s pieces,
and say whether the pool survived; if not, that `%dist restart` starts fresh ranks.
"""
from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Callable

from partrain_edu.launcher.diagnose import oneshot
from partrain_edu.launcher.diagnose.findings import AFTER_MISMATCH, MISMATCH_HINT, Finding
from partrain_edu.launcher.diagnose.oneshot import TorchrunError, TorchrunInterrupted

MARK_WAIT_S = 2.0  # a rank said "done": how long its end mark may take to reach the kernel's reading of its file
RESTART = "`%dist restart` (or `pool.restart()`) starts fresh ranks; their variables are lost."


class DistError(TorchrunError):
    """A warm cell failed; `rank` caused it. `pool_stopped`: the ranks are gone and the pool must be restarted."""

    def __init__(self, message: str, rank: int | None, outputs: dict[int, str], rank_traceback: str = "",
                 timed_out: bool = False, pool_stopped: bool = False):
        super().__init__(message, rank, rank_traceback, outputs, timed_out)
        self.pool_stopped = pool_stopped


class DistInterrupted(TorchrunInterrupted):
    """The stop button, during a warm cell: one line in the notebook, never the kernel's traceback."""

    def __init__(self, message: str, outputs: dict[int, str], pool_stopped: bool):
        super().__init__(f"interrupted: {message}", outputs)
        self.pool_stopped = pool_stopped


@dataclass
class Cell:
    """One cell in flight. `done[rank]` is that rank's answer: {} or its error report (`warm.rank_loop.describe`)."""

    number: int
    ranks: list[int]
    mark: str
    echo: Callable[[int | None, str], None]
    outputs: dict[int, list[str]] = field(default_factory=dict)
    done: dict[int, dict] = field(default_factory=dict)
    done_at: dict[int, float] = field(default_factory=dict)
    marked: set[int] = field(default_factory=set)

    def show(self, rank: int, text: str) -> None:
        self.outputs.setdefault(rank, []).append(text)
        self.echo(rank, text)

    def texts(self) -> dict[int, str]:
        return {r: "\n".join(lines) + "\n" for r, lines in sorted(self.outputs.items()) if lines}

    def running(self) -> list[int]:
        return [r for r in self.ranks if r not in self.done]

    def finished(self, now: float) -> bool:
        return not self.running() and all(r in self.marked or now - self.done_at[r] > MARK_WAIT_S
                                          for r in self.ranks)

    def errors(self) -> list[dict]:
        return [report for report in self.done.values() if report.get("traceback")]

    def finished_cleanly(self) -> set[int]:
        """The ranks that ended the cell without an error: they will make no more calls in it."""
        return {rank for rank, report in self.done.items() if not report.get("traceback")}


def failed(cell: Cell, stopped_because: str = "", calls: Finding | None = None) -> DistError:
    """The rank whose exception caused the failure; a mismatch (the ranks' call records, else the backend's report)
    is the best story, and after a timeout the records say who waited for whom."""
    first = oneshot.first_error(cell.errors())
    others = sorted(e["rank"] for e in cell.errors() if e is not first)
    explained = calls.text if calls and (calls.kind == "mismatch" or first["timed_out"]) else first.get("mismatch")
    message = oneshot.raised(first, others, explained) + (f"\n{stopped_because}" if stopped_because else "")
    return DistError(message, first["rank"], cell.texts(), first["traceback"], first["timed_out"],
                     bool(stopped_because))


def stuck_after_raise(cell: Cell, grace_s: float) -> DistError:
    cause = failed(cell).rank
    return failed(cell, f"rank(s) {cell.running()} were still running {grace_s:g} s later, most likely waiting for "
                        f"rank {cause} in a collective, so the pool was stopped. {RESTART}")


def stuck_after_interrupt(cell: Cell, grace_s: float) -> DistInterrupted:
    return DistInterrupted(f"rank(s) {cell.running()} did not stop within {grace_s:g} s (stuck in a collective?), "
                           f"so the pool was stopped. {RESTART}", cell.texts(), pool_stopped=True)


def interrupted(cell: Cell) -> DistInterrupted:
    return DistInterrupted("every rank stopped its cell; the ranks and their variables are kept", cell.texts(),
                           pool_stopped=False)


def mismatch(cell: Cell, found: Finding) -> DistError:
    """The ranks' call records showed a collective mismatch that stood still (`findings.Watch`)."""
    return DistError(f"{found.text}\nThe ranks could never have finished this cell, so the pool was stopped at once, "
                     f"every rank killed: {RESTART} {AFTER_MISMATCH}", found.rank, cell.texts(), pool_stopped=True)


def timed_out(cell: Cell, timeout: float, calls: Finding | None = None) -> DistError:
    """`calls`: what the ranks' call records say about where they wait, told instead of the usual suspects."""
    stuck, finished = cell.running(), sorted(cell.done)
    if finished:
        why = f"rank(s) {stuck} were still in the cell, rank(s) {finished} had finished it. "
        why += calls.text if calls else MISMATCH_HINT
    else:
        why = f"Ranks still running: {stuck}. " + (calls.text if calls else "A rank stuck in a loop, or waiting in a "
                                                   "collective the others never reach, is the usual cause.")
    return DistError(f"timed out after {timeout:g} s: {why} If the cell is just slow, raise the limit: "
                     "`%%dist --timeout N` or `pool.run(..., timeout=N)` (none / None: no limit). The pool was "
                     f"stopped, every rank killed: {RESTART}", finished[0] if finished else None, cell.texts(),
                     timed_out=True, pool_stopped=True)


def died(cell: Cell, exit_codes: dict[int, int], agent_code: int | None, calls: Finding | None = None) -> DistError:
    """A rank's process, or its worker, ended in the middle of a cell. `exit_codes`: each rank's, as its worker
    saved them (`nanny`); `calls`: what the ranks' call records say."""
    # As in oneshot.failure: a rank killed by a signal is the cause, then one that ended by itself; SIGTERM is
    # torch's agent stopping the rest.
    rank = min(exit_codes, key=lambda r: (exit_codes[r] == -signal.SIGTERM, exit_codes[r] >= 0, r), default=None)
    if rank is None:  # every rank was alive: a worker, or torch's agent itself, went (killed from outside)
        how = "still running" if agent_code is None else f"exit code {agent_code}"
        return DistError(f"torch's agent, which watches the ranks, ended ({how}); the ranks were stopped. {RESTART}",
                         None, cell.texts(), pool_stopped=True)
    code, outputs = exit_codes.get(rank), cell.texts()
    if code is not None and code < 0:
        text = oneshot.killed(rank, code, outputs, calls if calls and calls.kind == "mismatch" else None)
    else:
        exit_code = f", exit code {code}" if code else ""
        text = (f"rank {rank} ended its process (os._exit?) before finishing the cell{exit_code}; the other ranks "
                f"were stopped{oneshot.last_lines(outputs, rank)}")
    head, _, tail = text.partition("\n")
    return DistError(f"{head.rstrip('.')}. {RESTART}" + (f"\n{tail}" if tail else ""), rank, outputs, pool_stopped=True)
