"""Runs one multi-rank check in the sandbox, in a fresh process the submission's notebook never ran in:
`python -I -m partrain_edu.grading.rank_runner JOB` with JOB = {"check", "sources": [{"name", "text"}],
"timeout"}; answers {"problems": [...]} on the channel (channel.py).

Only the learner's function bodies run here (on the ranks, called by the check), never the notebook's other
cells, so a cell that patches the grader (`core.run_check = ...`) has no effect on this verdict. The grader
still reads the answer as untrusted data: a function body could forge its own check's answer from inside a
rank (it shares that process with the check), which is why this runs in the sandbox and not in the grader.
"""
from __future__ import annotations

import json
import sys

from partrain_edu.grading import channel, core


def main() -> None:
    _, writer = channel.sandbox_end()
    with open(sys.argv[1]) as f:
        job = json.load(f)
    sources = [core.Source(s["name"], s["text"]) for s in job["sources"]]
    result = core.run_check(job["check"], *sources, timeout=job["timeout"])
    channel.reply(writer, {"problems": result.details.get("problems", [])})


if __name__ == "__main__":
    main()
