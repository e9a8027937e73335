"""What went wrong in a failed launch, told as one `TorchrunError` that names the rank that caused it.

The launcher's run folder says what each rank did: rank{k}.pid (started), rank{k}.error (raised; the traceback,
trimmed to the learner's frames, and when), rank{k}.done (finished cleanly), rank{k}.calls (the collective it is
in or made last, `launcher.call_records`), rank{k}.exit (how it ended, negative for a signal: `launcher.nanny`).
Most ranks that fail only fail because another one did: the job here is to find that other one, and to say in
words what a collective mismatch (different sizes, dtypes, ops or order across ranks) was: from the call records
where they show one, else as the backend reported it (`explain_mismatch`).
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
# The ranks' environment for diagnosis, applied by the launcher unless the caller set the variable itself.
# TORCH_DISTRIBUTED_DEBUG=DETAIL would name each rank's op, shapes and dtypes in a mismatch (its ProcessGroupWrapper
# all-gathers a fingerprint on a helper Gloo group before every collective), and CommTracer's bytes are the same
# under it; it stays off because, measured with torch 2.13 + Gloo on 2 ranks sharing 2 loaded cores:
# - torch's DistributedDataParallel segfaults in its constructor (c10d::Logger casts the wrapper to
#   ProcessGroupGloo): the torch-ddp strategy, tests/test_comm.py on 2 ranks;
# - correct code on sub-groups fails: tests/test_comm.py on 4 ranks stops with "Sequence number: 11vs 12";
# - each collective costs ~4x: 0.22 -> 1.0 ms for 4 bytes, 0.86 -> 4-6 ms for 1 MiB (median of 300/60 calls);
#   a small MLP's data-parallel step 9.4 -> 15 ms; the timing cells of the course would teach the overhead.
# Gloo's own line ("Received data size doesn't match expected size") still reaches `explain_mismatch`, with sizes
# in bytes; a learner who wants the shapes turns DETAIL on for one run (MISMATCH_DETAIL says how).
RANK_DEBUG_ENV: dict[str, str] = {"TORCH_DISTRIBUTED_DEBUG": "OFF"}
MISMATCH_DETAIL = ("To see each rank's shapes and dtypes, run it once more with TORCH_DISTRIBUTED_DEBUG=DETAIL "
                   "(`%env TORCH_DISTRIBUTED_DEBUG=DETAIL` in the notebook, or torchrun(..., env={...})); torch's "
                   "DistributedDataParallel crashes under it on Gloo.")


# TORCH_DISTRIBUTED_DEBUG=DETAIL's report: "Rank 0 is running collective: CollectiveFingerPrint(SequenceNumber=0,
# OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, ...), but Rank 1 is running collective: ..." (a barrier's
# fingerprint has no tensor fields).
_FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=(\d+),? ?"
                          r"OpType=(\w+)(?:, TensorShape=(.*?), TensorDtypes=(\w+))?")
# Gloo's own check, when a rank receives more bytes than its own call expects (it then aborts that rank).
_GLOO_SIZE = re.compile(r"(\d+) vs (\d+)\. Received data size doesn't match expected size")
_DEVICE_OPTIONS = re.compile(r", TensorDeviceTypes=TensorOptions\((?:[^()]|\([^()]*\))*\)")
_NEVER_REACHED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
_OPS = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather_into_tensor",
        "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor", "ALLTOALL": "all_to_all",
        "ALLTOALL_BASE": "all_to_all_single", "BROADCAST": "broadcast", "REDUCE": "reduce", "GATHER": "gather",
        "SCATTER": "scatter", "SEND": "send", "RECV": "recv", "BARRIER": "barrier"}
_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16", "Long": "int64",
           "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}
_LOOK_FOR = ("look for a size that depends on the rank (an uneven split), a dtype that differs, two collectives "
             "called in a different order, or a rank that skipped one.")


def explain_mismatch(text: str) -> str | None:
    """One or two sentences on a collective mismatch reported in a rank's output or traceback `text` (torch's
    DETAIL fingerprints, Gloo's size check, or DETAIL's barrier a rank never reached); None if there is none."""
    calls = [m.groups() for m in _FINGERPRINT.finditer(text)]
    # The first report's pair: its rank, then the next fingerprint of another rank (the text may hold several).
    other = next((c for c in calls[1:] if c[0] != calls[0][0]), None) if calls else None
    if other is not None:
        (rank_a, seq, *call_a), (rank_b, _, *call_b) = calls[0], other
        return (f"collective mismatch: rank {rank_a} {_call(*call_a)}, rank {rank_b} {_call(*call_b)} (collective "
                f"#{seq} of that group). Every rank must call the same collective with the same sizes and dtypes: "
                + _LOOK_FOR)
    if sizes := _GLOO_SIZE.search(text):
        got, expected = sizes.groups()
        return (f"collective mismatch: a rank received {got} bytes where its own call expected {expected} (Gloo: "
                "\"Received data size doesn't match expected size\"): the ranks passed tensors of different sizes or "
                f"dtypes to one collective, or called different ones; {_LOOK_FOR} {MISMATCH_DETAIL}")
    if never := _NEVER_REACHED.search(text):
        ranks = never.group(1).replace(" ", "")
        return (f"collective mismatch: rank(s) {ranks} never reached this collective: they skipped it, finished "
                f"or are stuck elsewhere. {MISMATCH_HINT}")
    return None


def gloo_sizes(text: str) -> tuple[int, int] | None:
    """(bytes received, bytes the receiving call expected) when `text` holds Gloo's size check, else None."""
    sizes = _GLOO_SIZE.search(text)
    return None if sizes is None else (int(sizes.group(1)), int(sizes.group(2)))


def _call(op: str, shape: str, dtype: str) -> str:
    if not shape:  # no tensors: a barrier (the wrapper reports Gloo's barrier as REDUCE)
        return "barrier" if op in ("BARRIER", "REDUCE") else _OPS.get(op, op.lower())
    return f"{_OPS.get(op, op.lower())} {_DTYPES.get(dtype, dtype)}{shape}"


class TorchrunError(RuntimeError):
    """A rank failed, died or hung. `rank` is the rank that caused it (None if none could be named)."""

    def __init__(self, message: str, rank: int | None, rank_traceback: str = "",
                 outputs: dict[int, str] | None = None, timed_out: bool = False):
        super().__init__(message)
        self.rank = rank
        self.rank_traceback = rank_traceback
        self.timed_out = timed_out
        self.outputs = outputs or {}

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the launcher's own stack: the learner's error is the rank's.
        return [f"TorchrunError: {self}"]


class TorchrunInterrupted(KeyboardInterrupt):
    """The run was interrupted (the notebook's stop button, Ctrl-C) and every rank was stopped. Still a
    KeyboardInterrupt, so that whatever stops on one stops on this; IPython shows its one line, not the stack of
    the launcher waiting for its ranks."""

    def __init__(self, nproc: int, seconds: float, outputs: dict[int, str] | None = None):
        super().__init__(f"interrupted: every rank was stopped ({nproc} ranks, {seconds:.1f} s)")
        self.outputs = outputs or {}

    def _render_traceback_(self) -> list[str]:
        return [f"KeyboardInterrupt: {self}"]


def failure(run: Any, returncode: int) -> TorchrunError:
    """Name the rank whose failure caused the others', show its traceback, and list the ranks left stuck.
    `run` is the launcher's `output.Run`."""
    errors = {e["rank"]: e for e in (json.loads(p.read_text()) for p in run.run_dir.glob("rank*.error"))}
    exit_codes = nanny.exit_codes(run.run_dir)
    outputs = run.texts()
    # A rank killed by a signal (OOM killer, segfault, kill -9, Gloo's abort on a mismatch) writes no error; the
    # others then fail only because it vanished, so it is the cause, whichever failure torchrun saw first. SIGTERM
    # is torchrun's own clean-up of the survivors: a cause only when nothing else went wrong.
    signalled = {rank: code for rank, code in exit_codes.items() if code < 0 and rank not in errors}
    killed = {rank: code for rank, code in signalled.items() if code != -signal.SIGTERM}
    if not killed and not errors:
        killed = signalled
    calls = findings.diagnose(run.run_dir, run.nproc, run.ranks_with(".done"))  # where each rank's calls stand
    mismatch = calls if calls and calls.kind == "mismatch" else None
    if killed:
        rank = min(killed)
        code = -killed[rank]
        name = signal.Signals(code).name if code in signal.valid_signals() else str(code)
        last = outputs.get(rank, "").strip().splitlines()[-5:]
        tail = ("\nits last lines:\n" + "\n".join(last)) if last else ""
        # Gloo aborts the rank that received more than it expected, after printing why (in bytes).
        aborted = (with_backend_words(mismatch.text, "\n".join(outputs.values())) if mismatch
                   else explain_mismatch(outputs.get(rank, "")))
        cause = f": {aborted}" if aborted else " before raising a Python error; the other ranks were stopped"
        return TorchrunError(f"rank {rank} was killed by signal {name}{cause}{tail}", rank, "", outputs)
    if not errors:
        return TorchrunError(f"torchrun exited with code {returncode} and no rank reported an error:\n"
                             + "\n".join(run.launcher[-20:]), min(exit_codes, default=None), "", outputs)
    if mismatch:  # Gloo may let a mismatched call through on some ranks, which then finish or fail elsewhere
        return _mismatched(mismatch, errors, outputs)
    finished = sorted(run.ranks_with(".done"))
    if finished and all(_is_consequence(e["traceback"]) or e["timed_out"] for e in errors.values()):
        return _left_early(finished, True, errors, outputs)
    # Every error says a peer closed its connection, and no rank was killed or raised: the peer was leaving,
    # typically finishing after it skipped the collective, and torchrun stopped it before its .done was written.
    if all(_is_consequence(e["traceback"]) for e in errors.values()) and (stuck := stuck_ranks(run)):
        return _left_early(stuck, False, errors, outputs)
    # The earliest error is the cause, except that a rank whose peer vanished ("connection closed/reset by
    # peer") is only a consequence: the peer's own error (often a timeout) can be written a moment later.
    first = min(errors.values(), key=lambda e: (_is_consequence(e["traceback"]), e["time"]))
    others = sorted(r for r in errors if r != first["rank"])
    also = f" (then rank(s) {others} failed too)" if others else ""
    stuck = stuck_ranks(run)
    if first["timed_out"] and stuck:
        also += f"; rank(s) {stuck} never got that far"
    # A timeout: the records say who waited for whom, in the learner's terms.
    explained = calls.text if calls and first["timed_out"] else _first_mismatch(errors, outputs)
    message = f"rank {first['rank']} failed{also}:{' ' if explained else ''}{explained or ''}\n" \
              f"{_tidy(first['traceback']).rstrip()}"
    return TorchrunError(message, first["rank"], first["traceback"], _without(outputs, first), first["timed_out"])


def _mismatched(found: findings.Finding, errors: dict[int, dict], outputs: dict[int, str]) -> TorchrunError:
    """The records show ranks that disagreed on a collective: that is the story, whoever raised first."""
    first = min(errors.values(), key=lambda e: e["time"])
    message = f"{found.text}\nrank {first['rank']} failed here:\n{_tidy(first['traceback']).rstrip()}"
    timed_out = any(e["timed_out"] for e in errors.values())
    return TorchrunError(message, found.rank, "", _without(outputs, first), timed_out)


def with_backend_words(text: str, output: str) -> str:
    """The records' sentence, with Gloo's own report of the mismatch when a rank's `output` holds one."""
    sizes = _GLOO_SIZE.search(output)
    return text if sizes is None else (f"{text} (Gloo: a rank received {sizes.group(1)} bytes where its own call "
                                       f"expected {sizes.group(2)}.)")


def mismatch_error(run: Any, found: findings.Finding) -> TorchrunError:
    """The ranks' records showed a collective mismatch that stood still (`findings.Watch`): the run was stopped."""
    return TorchrunError(f"{found.text}\nThe ranks could never have finished, so the run was stopped at once; every "
                         f"rank was killed. {findings.AFTER_MISMATCH}", found.rank, "", run.texts())


def _left_early(left: list[int], finished: bool, errors: dict[int, dict], outputs: dict[int, str]) -> TorchrunError:
    """The commonest deadlock: a rank skips a collective and finishes, and the ones waiting for it in that
    collective fail (Gloo: "Connection closed by peer"; or their collective times out). The rank that left is the
    one to look at, not the first to report an error."""
    waiting = min(errors.values(), key=lambda e: e["time"])
    how = "finished" if finished else "stopped taking part, without an error,"
    message = (f"rank {left[0]} {how} while rank(s) {sorted(errors)} still waited for it in a collective, "
               f"which then failed. {MISMATCH_HINT}\nrank {waiting['rank']} was waiting here:\n"
               f"{_tidy(waiting['traceback']).rstrip()}")
    return TorchrunError(message, left[0], "", _without(outputs, waiting),
                         any(e["timed_out"] for e in errors.values()))


def _first_mismatch(errors: dict[int, dict], outputs: dict[int, str]) -> str | None:
    """The first collective mismatch any rank reported: in its error (earliest first), else in its output (Gloo
    aborts a rank with its line on stderr and no Python error)."""
    texts = [e["traceback"] for e in sorted(errors.values(), key=lambda e: e["time"])]
    return next(filter(None, map(explain_mismatch, texts + [outputs[r] for r in sorted(outputs)])), None)


def _without(outputs: dict[int, str], error: dict) -> dict[int, str]:
    """`outputs` with the rank's own copy of the traceback the message shows (the rank also printed it): a
    notebook reprints these outputs above the error, and the traceback should appear once."""
    text, traceback_text = outputs.get(error["rank"], ""), error["traceback"]
    at = text.rfind(traceback_text) if traceback_text.strip() else -1
    if at < 0:
        return outputs
    rest, kept = text[:at] + text[at + len(traceback_text):], dict(outputs)
    if rest.strip():
        kept[error["rank"]] = rest
    else:  # nothing else printed: no empty "[rank k]" line either
        del kept[error["rank"]]
    return kept


def _tidy(traceback_text: str) -> str:
    """DETAIL's fingerprints without their device options (a long line that says nothing about the mismatch)."""
    return _DEVICE_OPTIONS.sub("", traceback_text)


def _is_consequence(traceback_text: str) -> bool:
    return any(words in traceback_text for words in CONSEQUENCES)


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
    calls = findings.explain_calls(run.run_dir, run.nproc)
    why = calls or ("If it should have finished by now, a rank stuck in a loop, or waiting in a collective the "
                    "others never reach, is the usual cause.")
    message = f"timed out after {timeout:g} s; every rank was killed. {state} {RAISE_HINT} {why}"
    return TorchrunError(message, None, "", run.texts(), timed_out=True)
