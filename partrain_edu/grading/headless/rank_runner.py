"""Runs the observe half of one multi-rank check in the sandbox, in a fresh process the submission's notebook
never ran in: `python -I -m partrain_edu.grading.headless.rank_runner JOB` with JOB = {"check", "sources": [{"name",
"text"}], "timeout", "seed"}; answers on the channel (channel.py) either {"observations": JSON text} — what rank 0
published, passed on unread — or {"failure": message} when a rank raised, hung or reported nothing.

Only the learner's function bodies run here (on the ranks), never the notebook's other cells. Nothing this
process says is a verdict: the grader verifies the observations itself (observations.verify), and a failure
can only fail the check, so a body that takes over this process gains nothing by it.
"""
from __future__ import annotations

import json
import sys

from partrain_edu.grading.headless import channel
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.on_ranks import observe_on_ranks
from partrain_edu.grading.registry import LearnerError
from partrain_edu.grading.runner import spec_of


def main() -> None:
    _, writer = channel.sandbox_end()
    with open(sys.argv[1]) as f:
        job = json.load(f)
    sources = [Source(s["name"], s["text"]) for s in job["sources"]]
    spec = spec_of(job["check"], len(sources))
    try:
        channel.reply(writer, {"observations": observe_on_ranks(spec, sources, job["timeout"], job["seed"])})
    except LearnerError as err:
        channel.reply(writer, {"failure": str(err)})


if __name__ == "__main__":
    main()
