"""What went wrong in a failed launch, told as one `TorchrunError` that names the rank that caused it.

The run folder says what each rank did: rank{k}.pid (started), .error (raised: its traceback, trimmed to the
learner's frames, and when), .done (finished cleanly), .calls (its collective, `call_records`), .exit (how it ended,
negative for a signal: `nanny`). Most ranks fail only because another one did: the job is to find that one, and
to say in words what a collective mismatch was, from the call records or from Gloo's own report (`explain_mismatch`).
The warm pool (`diagnose.warm`) tells the same stories with the same pieces.
"""
from __future__ import annotations

import json
import re
import signal
from typing import Any

from partrain_edu.launcher import nanny
from partrain_edu.launcher.diagnose import findings
from partrain_edu.launcher.diagnose.findings import MISMATCH_HINT

# Errors a rank gets only because another rank died or gave up first (Gloo's and NCCL's wording).
CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted")
RAISE_HINT = ("If the run is just slow, raise the limit: `%%torchrun --timeout N` or `torchrun(..., timeout=N)` "
              "(`--timeout none` / `timeout=None`: no limit).")
# Gloo's own check, when a rank receives more bytes than its own call expects (it then aborts that rank). The
# call records name each rank's op, shapes and dtypes, so TORCH_DISTRIBUTED_DEBUG=DETAIL is never needed for
# that (under it, measured with torch 2.13 + Gloo: DDP segfaults, sub-groups fail, each collective costs ~4x).
_GLOO_SIZE = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
_DEVICE_OPTIONS = re.compile(r", TensorDeviceTypes=TensorOptions\((?:[^()]|\([^()]*\))*\)")  # DETAIL's noise


class TorchrunError(RuntimeError):
    """A rank failed, died or hung. `rank` is the rank that caused it (None if none could be named)."""

    def __init__(self, message: str, rank: int | None, rank_traceback: str = "",
                 outputs: dict[int, str] | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.timed_out = timed_out
        self.outputs = outputs or {}

    def _render_traceback_(self) -> list[str]:  # IPython shows this, not the launcher's stack
        return [f"{type(self).__name__}: {self}"]


class TorchrunInterrupted(KeyboardInterrupt):
    """The stop button (or Ctrl-C) stopped every rank. Still a KeyboardInterrupt, so that whatever stops on one
    stops on this; IPython shows its one line, not the stack of the launcher waiting for its ranks."""

    def __init__(self, message: str, outputs: dict[int, str] | None = None):
        super().__init__(message)
        self.outputs = outputs or {}

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


def explain_mismatch(text: str) -> str | None:
    """A sentence on the collective mismatch Gloo reported in a rank's output or traceback `text`, else None."""
    if (sizes := gloo_sizes(text)) is None:
        return None
    return (f"collective mismatch: a rank received {sizes[0]} bytes where its own call expected {sizes[1]} (Gloo: "
            "\"Received data size doesn't match expected size\"): the ranks passed tensors of different sizes or "
            "dtypes to one collective, or called different ones; look for a size that depends on the rank (an "
            "uneven split), a dtype that differs, two collectives called in a different order, or a rank that "
            "skipped one.")


def gloo_sizes(text: str) -> tuple[int, int] | None:
    """(bytes received, bytes the receiving call expected) when `text` holds Gloo's size check, else None."""
    sizes = _GLOO_SIZE.search(text)
    return None if sizes is None else (int(sizes.group(1)), int(sizes.group(2)))


def killed(rank: int, code: int, outputs: dict[int, str], mismatch: findings.Finding | None) -> str:
    """"rank 1 was killed by signal SIGABRT: why; its last lines": a rank that died without a Python error. Gloo
    aborts the rank that received more than it expected, after printing why (in bytes)."""
    name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
    if mismatch is None:
        aborted = explain_mismatch(outputs.get(rank, ""))
    elif sizes := gloo_sizes("\n".join(outputs.values())):
        aborted = f"{mismatch.text} (Gloo: a rank received {sizes[0]} bytes where its own call expected {sizes[1]}.)"
    else:
        aborted = mismatch.text
    cause = f": {aborted}" if aborted else " before raising a Python error; the other ranks were stopped"
    return f"rank {rank} was killed by signal {name}{cause}{last_lines(outputs, rank)}"


def last_lines(outputs: dict[int, str], rank: int) -> str:
    last = outputs.get(rank, "").strip().splitlines()[-5:]
    return "\nits last lines:\n" + "\n".join(last) if last else ""


def first_error(reports: list[dict]) -> dict:
    """The report that caused the others: the earliest, except that a rank whose peer vanished ("connection closed
    by peer") is only a consequence, and one that names a mismatch the best story."""
    return min(reports, key=lambda e: (is_consequence(e["traceback"]), not e.get("mismatch"), e["time"]))


def raised(first: dict, others: list[int], explained: str | None, stuck: list[int] = ()) -> str:
    """"rank 1 failed (then rank(s) [0] failed too): why", then its traceback."""
    also = (f" (then rank(s) {others} failed too)" if others else "") + (
        f"; rank(s) {stuck} never got that far" if stuck else "")
    why = f" {explained}" if explained else ""
    return f"rank {first['rank']} failed{also}:{why}\n{tidy(first['traceback']).rstrip()}"


def failure(run: Any, returncode: int) -> TorchrunError:
    """Name the rank whose failure caused the others', show its traceback, and list the ranks left stuck.
    `run` is the launcher's `output.Run`."""
    errors = {e["rank"]: e for e in (json.loads(p.read_text()) for p in run.run_dir.glob("rank*.error"))}
    exit_codes = nanny.exit_codes(run.run_dir)
    outputs = run.texts()
    # A rank killed by a signal (OOM killer, segfault, kill -9, Gloo's abort) writes no error: it is the cause.
    # SIGTERM is torch's agent stopping the survivors: a cause only when nothing else went wrong.
    signalled = {rank: code for rank, code in exit_codes.items() if code < 0 and rank not in errors}
    dead = {rank: code for rank, code in signalled.items() if code != -signal.SIGTERM} or (
        {} if errors else signalled)
    calls = findings.diagnose(run.run_dir, run.nproc, run.ranks_with(".done"))  # where each rank's calls stand
    mismatch = calls if calls and calls.kind == "mismatch" else None
    if dead:
        rank = min(dead)
        return TorchrunError(killed(rank, dead[rank], outputs, mismatch), rank, "", outputs)
    if not errors:
        return TorchrunError(f"torchrun exited with code {returncode} and no rank reported an error:\n"
                             + "\n".join(run.launcher[-20:]), min(exit_codes, default=None), "", outputs)
    if mismatch:  # Gloo may let a mismatched call through on some ranks, which then finish or fail elsewhere
        earliest = min(errors.values(), key=lambda e: e["time"])
        message = f"{mismatch.text}\n{where(earliest, 'failed')}"
        return TorchrunError(message, mismatch.rank, "", without(outputs, earliest),
                             any(e["timed_out"] for e in errors.values()))
    finished, stuck = sorted(run.ranks_with(".done")), stuck_ranks(run)
    if finished and all(is_consequence(e["traceback"]) or e["timed_out"] for e in errors.values()):
        return _left_early(finished, "finished", errors, outputs)
    # Every error says a peer closed its connection and no rank raised: that peer was leaving (typically finishing
    # after it skipped the collective) and torch's agent stopped it before its .done was written.
    if stuck and all(is_consequence(e["traceback"]) for e in errors.values()):
        return _left_early(stuck, "stopped taking part, without an error,", errors, outputs)
    first = first_error(list(errors.values()))
    others = sorted(r for r in errors if r != first["rank"])
    # A timeout: the records say who waited for whom, in the learner's terms.
    explained = calls.text if calls and first["timed_out"] else _first_mismatch(errors, outputs)
    message = raised(first, others, explained, stuck if first["timed_out"] else [])
    return TorchrunError(message, first["rank"], first["traceback"], without(outputs, first), first["timed_out"])


def mismatch_error(run: Any, found: findings.Finding) -> TorchrunError:
    """The ranks' records showed a collective mismatch that stood still (`findings.Watch`): the run was stopped."""
    return TorchrunError(f"{found.text}\nThe ranks could never have finished, so the run was stopped at once; every "
                         f"rank was killed. {findings.AFTER_MISMATCH}", found.rank, "", run.texts())


def _left_early(left: list[int], how: str, errors: dict[int, dict], outputs: dict[int, str]) -> TorchrunError:
    """The commonest deadlock: a rank skips a collective and finishes, and the ones waiting for it in that
    collective fail (Gloo: "Connection closed by peer", or a timeout). The rank that left is the one to look at."""
    waiting = min(errors.values(), key=lambda e: e["time"])
    message = (f"rank {left[0]} {how} while rank(s) {sorted(errors)} still waited for it in a collective, which then "
               f"failed. {MISMATCH_HINT}\n{where(waiting, 'was waiting')}")
    return TorchrunError(message, left[0], "", without(outputs, waiting), any(e["timed_out"] for e in errors.values()))


def _first_mismatch(errors: dict[int, dict], outputs: dict[int, str]) -> str | None:
    """The first collective mismatch any rank reported: in its error (earliest first), else in its output (Gloo
    aborts a rank with its line on stderr and no Python error)."""
    texts = [e["traceback"] for e in sorted(errors.values(), key=lambda e: e["time"])]
    return next(filter(None, map(explain_mismatch, texts + [outputs[r] for r in sorted(outputs)])), None)


def without(outputs: dict[int, str], error: dict) -> dict[int, str]:
    """`outputs` without the rank's own copy of the traceback the message shows: a notebook reprints these
    outputs above the error, and the traceback should appear once (and no empty "[rank k]" line either)."""
    text, traceback_text = outputs.get(error["rank"], ""), error["traceback"]
    at = text.rfind(traceback_text) if traceback_text.strip() else -1
    if at < 0:
        return outputs
    rest, kept = text[:at] + text[at + len(traceback_text):], dict(outputs)
    if rest.strip():
        kept[error["rank"]] = rest
    else:
        del kept[error["rank"]]
    return kept


def where(error: dict, verb: str) -> str:
    """"rank 1 failed here:" and its traceback, without the device options of DETAIL's fingerprints (a long line that
    says nothing about the mismatch)."""
    return f"rank {error['rank']} {verb} here:\n{tidy(error['traceback']).rstrip()}"


def tidy(traceback_text: str) -> str:
    return _DEVICE_OPTIONS.sub("", traceback_text)


def is_consequence(traceback_text: str) -> bool:
    return any(words in traceback_text for words in CONSEQUENCES)


def stuck_ranks(run: Any) -> list[int]:
    """Ranks that started but neither finished nor raised: where a deadlock usually is."""
    return sorted(run.ranks_with(".pid") - run.ranks_with(".error") - run.ranks_with(".done"))


def timeout_error(run: Any, timeout: float | None) -> TorchrunError:
    started, stuck = run.ranks_with(".pid"), stuck_ranks(run)
    if not started:
        state = "No rank had started yet (torchrun was still starting up)."
    else:
        state = f"Ranks still running: {stuck}." + (
            f" Never started: {sorted(set(range(run.nproc)) - started)}." if len(started) < run.nproc else "")
    found = findings.diagnose(run.run_dir, run.nproc)
    why = found.text if found else (
        "If it should have finished by now, a rank stuck in a loop, or waiting in a collective the others never "
        "reach, is the usual cause.")
    return TorchrunError(f"timed out after {timeout:g} s; every rank was killed. {state} {RAISE_HINT} {why}", None, "",
                         run.texts(), timed_out=True)
