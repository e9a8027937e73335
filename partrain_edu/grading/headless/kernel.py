"""The grading kernel: runs a submission's code cells in order (in IPython, so magics work; a cell's error
does not stop the next cell), then lends the functions they defined to the grader.

Started in the sandbox by grader.py as `python -I -m partrain_edu.grading.headless.kernel JOB` (JOB:
{"cells": [[number, code], ...]}). It says {"cell": number} before each cell and {"ran": n, "errors": [...]}
after the last, then answers requests, one JSON line each (channel.py):

    {"id", "op": "call", "name", "args", "timeout", "check"} → {"id", "value"} | {"id", "raised", "message"}
    {"id", "op": "source", "name"}                           → {"id", "value": {"name", "text"}}
    either                                                   → {"id", "problem"}  (no such function, too slow…)

`check(...)` calls in the notebook do nothing here (runner.defer_checks): the grader runs every check itself, so
nothing this process says — it runs the learner's code — is a verdict; only values and source text.
"""
from __future__ import annotations

import json
import sys
from typing import Any

from partrain_edu.grading.headless import channel
from partrain_edu.grading.learner_code import source_of
from partrain_edu.grading.registry import LearnerError
from partrain_edu.grading.runner import defer_checks, time_limit

MAX_VALUE_BYTES = 4 * 2**20


def _shell():
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite history file to write
    config.InteractiveShell.colors = "nocolor"
    return InteractiveShell.instance(config=config)


def _plain(obj: Any) -> Any:
    """JSON for what a learner's function may reasonably return besides plain data: tensors and arrays
    (`tolist`), numpy scalars (`__index__`, `__float__`), sets and ranges."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (set, frozenset, range)):
        return list(obj)
    if hasattr(obj, "__index__"):
        return obj.__index__()
    if hasattr(obj, "__float__"):
        return float(obj)
    raise TypeError(f"your function returned a {type(obj).__name__}, which is not plain data "
                    "(int, float, str, None, list, tuple, dict)")


def answer(namespace: dict, request: dict) -> dict:
    name = request.get("name")
    function = namespace.get(name) if isinstance(name, str) else None
    if not callable(function):
        return {"problem": f"your notebook defines no function {name!r} (after running every cell)"}
    if request.get("op") == "source":
        try:
            source = source_of(function)
        except LearnerError as exc:
            return {"problem": str(exc)}
        return {"value": {"name": source.name, "text": source.text}}
    try:
        with time_limit(float(request["timeout"]), str(request.get("check"))):
            value = function(*request["args"])
    except LearnerError as exc:
        return {"problem": str(exc)}
    except Exception as exc:  # the learner's error: the grader words it
        return {"raised": type(exc).__name__, "message": str(exc)[:2000]}
    try:
        text = json.dumps(value, default=_plain)
    except (TypeError, ValueError, RecursionError) as exc:
        return {"problem": str(exc) if "not plain data" in str(exc) else
                f"your function returned something that is not plain data ({exc})"}
    if len(text) > MAX_VALUE_BYTES:
        return {"problem": f"your function returned more than {MAX_VALUE_BYTES // 2**20} MiB"}
    return {"value": json.loads(text)}


def main() -> None:
    reader, writer = channel.sandbox_end()
    with open(sys.argv[1]) as f:
        cells = json.load(f)["cells"]
    shell = _shell()
    defer_checks()
    errors = []
    for number, source in cells:
        channel.reply(writer, {"cell": number})
        result = shell.run_cell(source, store_history=False)
        error = result.error_before_exec or result.error_in_exec
        if error is not None:
            errors.append(f"cell {number} raised {type(error).__name__}: {error}"[:300])
    channel.reply(writer, {"ran": len(cells), "errors": errors[:5]})
    for line in reader:
        try:
            request = json.loads(line)
            channel.reply(writer, {"id": request["id"], **answer(shell.user_ns, request)})
        except (ValueError, KeyError, TypeError) as exc:  # only the grader writes here: a bug, say it
            print(f"kernel: bad request {line[:200]!r}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
