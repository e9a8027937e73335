"""Launch the observe half of a multi-rank check on N ranks and bring back what they published: the JSON text
of every rank's observations (rank_main.py), to be verified by the caller (observations.verify).

The launcher (`launcher.oneshot.torchrun`) hands back what rank 0 published by unpickling it in the calling
process; the grading path publishes only a JSON string, and a rank that publishes something else gets a
failure here. For `partrain-edu check` this runs in the sandbox (headless/rank_runner.py), so the grader itself
reads nothing but that text off the channel. A rank that raises, hangs or exits early becomes a LearnerError
worded for the learner: the traceback is cut to the learner's own frames (no grader frames, no absolute paths).
"""
from __future__ import annotations

import json
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import MAX_TEXT_CHARS
from partrain_edu.grading.registry import Check, LearnerError, not_implemented

RANK_CODE = "from partrain_edu.grading.rank_main import main\nmain()\n"


def namespace_for(spec: Check) -> dict[str, Any]:
    """The globals a learner's function of check `spec` runs with on the ranks: torch, dist, nn, F and math,
    and the helpers the exercise hands out (the check's `given`)."""
    import math

    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    return {"torch": torch, "dist": dist, "nn": nn, "F": F, "math": math, **spec.given}


def observe_on_ranks(spec: Check, sources: list[Source], timeout: float, seed: int) -> str:
    """The published JSON text of check `spec` run on `spec.nproc` ranks with the learner's `sources`, on the
    configurations drawn from `seed`."""
    from partrain_edu.launcher.status_line import RankStatus

    with tempfile.TemporaryDirectory(prefix="partrain_check_") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"check": spec.name, "sources": [s.text for s in sources],
                                   "names": [s.name for s in sources], "seed": seed}))
        # In a notebook, a line from the first moment (the launcher loads torch: seconds in a fresh kernel) while
        # it waits: "check: starting 4 ranks… 4 s", then "check: waiting for 4 ranks (23 s, limit 60 s)".
        with RankStatus(spec.nproc, timeout, starting="check: starting {n} ranks… {s} s{up}",
                        running="check: waiting for {n} ranks ({s} s, {limit})") as status:
            from partrain_edu.launcher import TorchrunError, torchrun
            try:
                result = torchrun(RANK_CODE, nproc=spec.nproc, timeout=timeout, args=[str(job)], echo=None,
                                  started=status.started)
            except TorchrunError as err:
                raise LearnerError(explain_failure(err, spec, timeout, sources)) from None
    text = result.published.get("observations")
    if text is None:
        raise LearnerError("the ranks finished without reporting their observations: rank 0 never reached the "
                           "end of the check (does your code exit the process?)")
    if not isinstance(text, str):
        raise LearnerError(f"the ranks published a {type(text).__name__} instead of the check's observations: "
                           "does your code call runtime.publish?")
    if len(text) > MAX_TEXT_CHARS:  # said here, before it travels: the grader's channel has its own, higher cap
        raise LearnerError(f"the ranks published over {MAX_TEXT_CHARS // 2**20} MiB of observations: does your "
                           "code call runtime.publish?")
    return text


def explain_failure(err, spec: Check, timeout: float, sources: list[Source]) -> str:
    """Why the launch failed, for the learner: not implemented, a message size mismatch or a deadlock (each with
    the check's hint), or the error a rank raised with the learner's own frames."""
    from partrain_edu.launcher.diagnose.oneshot import gloo_sizes

    tb = err.rank_traceback or str(err)
    last = [line[:500] for line in tb.strip().splitlines() if line.strip()][-1:] or [""]
    where = f"rank {err.rank}" if err.rank is not None else "the ranks"
    if "NotImplementedError" in last[0]:
        return f"{where}: " + not_implemented(last[0].split("NotImplementedError", 1)[1].lstrip(": "))
    sizes = gloo_sizes(tb + "\n" + "\n".join(err.outputs.values()) + "\n" + str(err))
    if sizes is not None:  # Gloo's raw "enforce fail … 12 vs 8", in the learner's terms
        got, expected = sizes
        return (f"{where}: a message of {got} bytes arrived where the receiving call expected {expected} bytes "
                "(Gloo stopped the run): two ranks disagree on a message — who sends to whom, or how many "
                f"elements. {spec.mismatch_hint or 'Every send must meet a receive of the same size from that rank.'}")
    if not err.rank_traceback and " was killed by signal " in str(err):  # no Python error: Gloo crashed the rank
        return (f"{str(err).strip().splitlines()[0][:300]} — a crash inside the backend, most often from ranks that "
                f"disagree on a message's size or partner. {spec.mismatch_hint or ''}".rstrip())
    if err.timed_out or "timed out" in tb.lower() or "timeout" in last[0].lower():
        return (f"{where}: timed out (limit {timeout:g} s) — the ranks waited on each other forever. "
                f"{spec.deadlock_hint or 'Every rank must make the same calls in the same order.'}")
    mine = learner_frames(tb, sources)
    hint = ""
    if last[0].startswith("NameError"):
        hint = (" — only your function's own source travels to the ranks: define any helper inside it "
                f"({', '.join(namespace_for(spec))} are there)")
    return (f"{where} raised {last[0].strip()}{hint}"
            + (f"\n{textwrap.indent(mine[-1500:], '      ')}" if mine else ""))


def learner_frames(tb: str, sources: list[Source]) -> str:
    """The frames of traceback `tb` that are in the learner's functions (compiled as "<your NAME>"), each with
    its line of the learner's source; empty when none is. The check's own frames and paths are left out."""
    texts = {f"<your {s.name}>": s.text.splitlines() for s in sources}
    out: list[str] = []
    for line in tb.splitlines():
        if not line.startswith('  File "'):
            continue
        filename, _, rest = line[len('  File "'):].partition('", line ')
        if filename not in texts:
            continue
        number = rest.split(",", 1)[0]
        out.append(f"{filename[1:-1]}, line {rest}")
        if number.isdigit() and 0 < int(number) <= len(texts[filename]):
            out.append("    " + texts[filename][int(number) - 1].strip())
    return "\n".join(out)
