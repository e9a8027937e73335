"""What went wrong in a failed launch, told as one `TorchrunError` that names the rank that caused it.

The launcher's run folder says what each rank did: rank{k}.pid (started), rank{k}.error (raised; the traceback,
trimmed to the learner's frames, and when), rank{k}.done (finished cleanly). torchrun's own report adds the exit
code of every rank that failed, negative for a signal. Most ranks that fail only fail because another one did:
the job here is to find that other one.
"""
from __future__ import annotations

import json
import re
import signal
from typing import Any

# Errors a rank gets only because another rank died or gave up first (Gloo's and NCCL's wording).
CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")
RAISE_HINT = ("If the run is just slow, raise the limit: `%%torchrun --timeout N` or `torchrun(..., timeout=N)` "
              "(`--timeout none` / `timeout=None`: no limit).")
MISMATCH_HINT = ("Every rank must make the same collective calls in the same order: look for an `if rank ...` "
                 "around a collective, an early `return` or `sys.exit()`, or a loop whose length differs by rank.")


class TorchrunError(RuntimeError):
    """A rank failed, died or hung. `rank` is the rank that caused it (None if none could be named)."""

    def __init__(self, message: str, rank: int | None, rank_traceback: str = "",
                 outputs: dict[int, str] | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank, self.rank_traceback, self.timed_out = rank, rank_traceback, timed_out
        self.outputs = outputs or {}

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own stack: the learner's error is the rank's.
        return [f"TorchrunError: {self}"]


def failure(run: Any, returncode: int) -> TorchrunError:
    """Name the rank whose failure caused the others', show its traceback, and list the ranks left stuck.
    `run` is the launcher's `_Run`."""
    errors = {e["rank"]: e for e in (json.loads(p.read_text()) for p in run.run_dir.glob("rank*.error"))}
    exit_codes = torchrun_exit_codes("\n".join(run.launcher))
    outputs = run.texts()
    # A rank killed by a signal (OOM killer, segfault, kill -9) writes no error; the others then fail only
    # because it vanished, so it is the cause, whichever failure torchrun saw first. SIGTERM is torchrun's own
    # clean-up of the survivors: a cause only when nothing else went wrong.
    signalled = {rank: code for rank, code in exit_codes.items() if code < 0 and rank not in errors}
    killed = {rank: code for rank, code in signalled.items() if code != -signal.SIGTERM}
    if not killed and not errors:
        killed = signalled
    if killed:
        rank = min(killed)
        code = -killed[rank]
        name = signal.Signals(code).name if code in signal.valid_signals() else str(code)
        last = outputs.get(rank, "").strip().splitlines()[-5:]
        tail = ("\nits last lines:\n" + "\n".join(last)) if last else ""
        return TorchrunError(f"rank {rank} was killed by signal {name} before raising a Python error; "
                             f"the other ranks were stopped{tail}", rank, "", outputs)
    if not errors:
        return TorchrunError(f"torchrun exited with code {returncode} and no rank reported an error:\n"
                             + "\n".join(run.launcher[-20:]), min(exit_codes, default=None), "", outputs)
    finished = sorted(run.ranks_with(".done"))
    if finished and all(_is_consequence(e["traceback"]) or e["timed_out"] for e in errors.values()):
        return _finished_early(finished, errors, outputs)
    # The earliest error is the cause, except that a rank whose peer vanished ("connection closed/reset by
    # peer") is only a consequence: the peer's own error (often a timeout) can be written a moment later.
    first = min(errors.values(), key=lambda e: (_is_consequence(e["traceback"]), e["time"]))
    others = sorted(r for r in errors if r != first["rank"])
    also = f" (then rank(s) {others} failed too)" if others else ""
    stuck = stuck_ranks(run)
    if first["timed_out"] and stuck:
        also += f"; rank(s) {stuck} never got that far"
    message = f"rank {first['rank']} failed{also}:\n{first['traceback'].rstrip()}"
    return TorchrunError(message, first["rank"], first["traceback"], outputs, first["timed_out"])


def _finished_early(finished: list[int], errors: dict[int, dict], outputs: dict[int, str]) -> TorchrunError:
    """The commonest deadlock: a rank skips a collective and finishes, and the ones waiting for it in that
    collective fail (Gloo: "Connection closed by peer"; or their collective times out). The finished rank is the
    one to look at, not the first to report an error."""
    waiting = min(errors.values(), key=lambda e: e["time"])
    message = (f"rank {finished[0]} finished while rank(s) {sorted(errors)} still waited for it in a collective, "
               f"which then failed. {MISMATCH_HINT}\nrank {waiting['rank']} was waiting here:\n"
               f"{waiting['traceback'].rstrip()}")
    return TorchrunError(message, finished[0], "", outputs, any(e["timed_out"] for e in errors.values()))


def _is_consequence(traceback_text: str) -> bool:
    return any(words in traceback_text for words in CONSEQUENCES)


def torchrun_exit_codes(report: str) -> dict[int, int]:
    """{rank: exit code} of every failed rank in torchrun's ChildFailedError report ("rank : 1 ..." then
    "exitcode : -9 ..." in each block)."""
    blocks = re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", report)
    return {int(rank): int(code) for rank, code in blocks}


def stuck_ranks(run: Any) -> list[int]:
    """Ranks that started but neither finished nor raised: where a deadlock usually is."""
    return sorted(run.ranks_with(".pid") - run.ranks_with(".error") - run.ranks_with(".done"))


def timeout_error(run: Any, timeout: float | None) -> TorchrunError:
    started = run.ranks_with(".pid")
    stuck = stuck_ranks(run)
    if not started:
        state = "No rank had started yet (torchrun was still starting up)."
    else:
        state = f"Ranks still running: {stuck}." + (
            f" Never started: {sorted(set(range(run.nproc)) - started)}." if len(started) < run.nproc else "")
    message = (f"timed out after {timeout:g} s; every rank was killed. {state} {RAISE_HINT} If it should have "
               "finished by now, a rank stuck in a loop, or waiting in a collective the others never reach, "
               "is the usual cause.")
    return TorchrunError(message, None, "", run.texts(), timed_out=True)
