"""Grade one submitted notebook so that nothing in it can decide its grade but its answers.

- The checks that count are the instructor's (authoring/manifest.py, from solutions/), found by the exercise
  the file is named after; a submission whose check cell was deleted still owes that check.
- Its code runs in a sandbox (sandbox.py) on a private copy: the grading kernel (kernel.py) runs its cells,
  then lends the grader the functions they defined.
- The grader computes every verdict itself. In-process checks run here, in the grader, calling the learner's
  functions through the kernel with plain data and reading plain data back (a cell that patches `run_check`
  or forges a log patches the kernel, which decides nothing). Multi-rank checks run the functions' source on
  ranks started from a fresh sandboxed process (rank_runner.py) the notebook never ran in; the ranks only
  observe (values, gradients, traffic), and the grader verifies those observations against values it
  recomputes itself (the check's verify half), so a function body that forges a report can only report wrong
  values.
- One wall-clock limit covers the whole notebook: its cells and all its checks. A notebook that loops, exits
  or dies is killed with everything it started, and each check it owes fails with the reason.
"""
from __future__ import annotations

import functools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from partrain_edu.grading.authoring.manifest import EXERCISES
from partrain_edu.grading.headless.channel import Channel, Closed
from partrain_edu.grading.headless.sandbox import Isolation
from partrain_edu.grading.headless.submissions import NotANotebook, code_cells
from partrain_edu.grading.imports import refusal
from partrain_edu.grading.learner_code import Source, unanswered
from partrain_edu.grading.observations import verify
from partrain_edu.grading.registry import CheckResult, LearnerError
from partrain_edu.grading.runner import DEFAULT_TIMEOUT_S, graded, spec_of, time_limit
from partrain_edu.grading.trials import fresh_seed

HEADLESS = "partrain_edu.grading.headless"   # the sandboxed processes are its modules
STOP_GRACE_S = 5.0  # the kernel stops an overrunning call itself; past this, the grader kills it
MAX_SOURCE_CHARS = 2**20
MAX_MESSAGE_CHARS = 4000  # a problem quotes the learner's value: keep a gradebook row readable


class Kernel:
    """The grader's handle on one submission's grading kernel. Everything it returns is the learner's data."""

    def __init__(self, isolation: Isolation, work: Path, cells: list[tuple[int, str]]):
        job = work / "cells.json"
        job.write_text(json.dumps({"cells": cells}))
        job.chmod(0o444)
        self.isolation = isolation
        self.errors = []
        self.dead = None
        self._id = 0
        self.proc = isolation.spawn([sys.executable, "-I", "-m", f"{HEADLESS}.kernel", str(job)], work)
        self.channel = Channel(self.proc)

    def run_cells(self, deadline: float, limit: float) -> str | None:
        """None when every cell ran; else why the notebook could not be graded."""
        cell = None
        while True:
            try:
                message = self.channel.receive(deadline)
            except TimeoutError:
                where = f" (cell {cell} was still running: an endless loop?)" if cell is not None else ""
                return self._kill(f"the notebook did not finish within its {limit:g} s{where}")
            except Closed as closed:
                return self._kill(self._ended(closed, f"during cell {cell}" if cell is not None else
                                              "before its first cell"))
            if isinstance(message.get("cell"), int):
                cell = message["cell"]
            elif "ran" in message:
                errors = message.get("errors")
                self.errors = [str(e)[:300] for e in errors[:5]] if isinstance(errors, list) else []
                return None

    def call(self, name: str, args: list, check: str, deadline: float) -> Any:
        answer = self._ask({"op": "call", "name": name, "args": args, "check": check,
                            "timeout": max(0.1, deadline - time.monotonic())}, deadline)
        if answer.get("raised") == "NotImplementedError":
            raise NotImplementedError(str(answer.get("message", "")))
        if "raised" in answer:
            raise LearnerError(f"your code raised {str(answer['raised'])[:100]}: {str(answer.get('message'))}")
        return answer["value"]

    def source(self, name: str, deadline: float) -> Source:
        value = self._ask({"op": "source", "name": name}, deadline)["value"]
        if not (isinstance(value, dict) and isinstance(value.get("name"), str) and isinstance(value.get("text"), str)
                and len(value["text"]) <= MAX_SOURCE_CHARS):
            raise LearnerError(f"could not read the source of {name!r} (at most {MAX_SOURCE_CHARS} characters)")
        return Source(value["name"], value["text"])

    def stop(self) -> None:
        self.isolation.stop(self.proc)
        self.channel.close()

    def _ask(self, request: dict, deadline: float) -> dict:
        """The kernel's answer to `request`; a LearnerError when it has none (a problem, death, overrun)."""
        if self.dead:
            raise LearnerError(self.dead)
        self._id += 1
        try:
            self.channel.send({**request, "id": self._id})
            while True:
                answer = self.channel.receive(deadline + STOP_GRACE_S)
                if answer.get("id") == self._id and any(k in answer for k in ("value", "raised", "problem")):
                    break
        except TimeoutError:
            raise LearnerError(
                self._kill("your code ran past its time limit and did not stop: an endless loop?")) from None
        except Closed as closed:
            raise LearnerError(self._kill(self._ended(closed, "while the grader called your code"))) from closed
        if "problem" in answer:
            problem = str(answer["problem"])[:2000]
            raise LearnerError(problem + (f" ({self.errors[0]})" if "defines no function" in problem
                                          and self.errors else ""))
        return answer

    def _ended(self, closed: Closed, when: str) -> str:
        try:
            code = self.proc.wait(timeout=5)
        except Exception:  # still running: it closed its output on purpose
            return f"the notebook's process broke the grading channel {when} ({closed})"
        said = self.channel.stderr_tail()
        signal = -code if code < 0 else code - 128 if code > 128 else None  # Popen's way, or the jail's
        how = f"was killed by signal {signal}" if signal else f"exited with code {code}"
        return f"the notebook's process {how} {when}" + (f": {said[:200]}" if said and code else "")

    def _kill(self, reason: str) -> str:
        self.dead = reason
        self.isolation.stop(self.proc)
        return reason


def _rank_check(isolation: Isolation, spec, sources: list[Source], deadline: float, seed: int) -> list[str]:
    """The problems of multi-rank check `spec` on `sources`: observed on ranks started by a fresh sandboxed
    runner, verified here."""
    for source in sources:
        message = unanswered(source) or refusal(source.text, source.name)
        if message is not None:  # no ranks needed to say so
            return [message]
    limit = min(DEFAULT_TIMEOUT_S, deadline - time.monotonic() - STOP_GRACE_S)
    if limit < 1:
        raise LearnerError("not run: the notebook's time limit was used up")
    with isolation.folder() as work:
        job = work / "job.json"
        job.write_text(json.dumps({"check": spec.name, "timeout": limit, "seed": seed,
                                   "sources": [{"name": s.name, "text": s.text} for s in sources]}))
        job.chmod(0o444)
        proc = isolation.spawn([sys.executable, "-I", "-m", f"{HEADLESS}.rank_runner", str(job)], work)
        channel = Channel(proc)
        try:
            answer = channel.receive(deadline)
        except TimeoutError:
            raise LearnerError("not finished: the notebook's time limit was used up") from None
        except Closed:
            raise LearnerError(f"the check's runner ended without a report: {channel.stderr_tail()[:300]}") from None
        finally:
            isolation.stop(proc)
            channel.close()
    if isinstance(answer.get("failure"), str):  # worded on the learner's side: it can only fail the check
        raise LearnerError(answer["failure"][:MAX_MESSAGE_CHARS])
    if "observations" not in answer:
        raise LearnerError("the check's runner answered neither observations nor a failure")
    return verify(spec, answer["observations"], seed)


def grade_notebook(path: Path, exercise: str | None, isolation: Isolation, timeout: float,
                   seed: int | None = None) -> dict:
    """{"path", "exercise", "score", "seconds", "checks": [{"name", "passed", "message", "seed"}]} (+ "error" when
    the file cannot be graded at all). Each check draws fresh configurations, or those of `seed` when given."""
    start = time.monotonic()
    try:
        return _grade(path, exercise, isolation, timeout, start, seed)
    except Exception as err:  # a grader bug must cost this notebook's row, not the rest of the folder
        return _report(path, exercise, [], start, f"the grader failed on this file ({type(err).__name__}: {err})")


def _grade(path: Path, exercise: str | None, isolation: Isolation, timeout: float, start: float,
           fixed_seed: int | None) -> dict:
    deadline = start + timeout
    if exercise is None:
        return _report(path, None, [], start, f"cannot tell which exercise this is: name the file after one of "
                       f"{', '.join(EXERCISES)} (or pass --exercise)")
    owed = EXERCISES[exercise]
    specs = {name: spec_of(name, len(functions)) for name, functions in owed}
    try:
        cells = code_cells(path)
    except NotANotebook as err:
        return _report(path, exercise, [_failed(specs[name], str(err)) for name, _ in owed], start)
    refused = next(filter(None, (refusal(text, f"cell {number}") for number, text in cells)), None)
    if refused:  # a notebook that imports the course's implementation is graded on none of its checks
        return _report(path, exercise, [_failed(specs[name], refused) for name, _ in owed], start)
    results: dict[str, CheckResult] = {}
    sources: dict[str, list[Source]] = {}
    with isolation.folder() as work:
        shutil.copyfile(path, work / path.name)  # the notebook's own copy, should it read itself
        kernel = Kernel(isolation, work, cells)
        try:
            failure = kernel.run_cells(deadline, timeout)
            for name, functions in owed:
                if failure:
                    results[name] = _failed(specs[name], failure)
                elif specs[name].nproc == 0:
                    try:
                        texts = [kernel.source(f, deadline) for f in functions]
                        refused = next(filter(None, (refusal(t.text, t.name) for t in texts)), None)
                    except LearnerError as err:
                        refused = str(err)
                    if refused:
                        results[name] = _failed(specs[name], refused)
                        continue
                    check_deadline = min(deadline, time.monotonic() + DEFAULT_TIMEOUT_S)
                    learner = [_Function(kernel, f, name, check_deadline) for f in functions]
                    seed = fresh_seed() if fixed_seed is None else fixed_seed
                    check = functools.partial(_in_time, specs[name], learner, check_deadline, seed)
                    results[name] = graded(specs[name], check, seed)
                else:  # the source now, the ranks once the kernel is gone
                    try:
                        sources[name] = [kernel.source(f, deadline) for f in functions]
                    except LearnerError as err:
                        results[name] = _failed(specs[name], str(err))
        finally:
            kernel.stop()
    for name, texts in sources.items():
        seed = fresh_seed() if fixed_seed is None else fixed_seed
        check = functools.partial(_rank_check, isolation, specs[name], texts, deadline, seed)
        results[name] = graded(specs[name], check, seed)
    return _report(path, exercise, [results[name] for name, _ in owed], start)


def _in_time(spec, learner: list, deadline: float, seed: int) -> list[str]:
    # The check's own work on the learner's return values is bounded too (a huge schedule to simulate).
    with time_limit(max(0.1, deadline - time.monotonic()) + 2 * STOP_GRACE_S, spec.name):
        return spec.verify(*learner, seed=seed)


class _Function:
    """Stands in for a learner's function inside an in-process check: each call is a request to the kernel."""

    def __init__(self, kernel: Kernel, name: str, check: str, deadline: float):
        self.__name__ = name
        self._kernel = kernel
        self._check = check
        self._deadline = deadline

    def __call__(self, *args: Any) -> Any:
        return self._kernel.call(self.__name__, list(args), self._check, self._deadline)


def _failed(spec, reason: str) -> CheckResult:
    return graded(spec, lambda: [reason])


def _report(path: Path, exercise: str | None, results: list[CheckResult], start: float, error: str = "") -> dict:
    checks = [{"name": r.name, "passed": r.passed, "message": r.message[:MAX_MESSAGE_CHARS],
               **({"seed": r.details["seed"]} if "seed" in r.details else {})} for r in results]
    score = round(sum(c["passed"] for c in checks) / len(checks), 4) if checks else 0.0
    report = {"path": str(path), "exercise": exercise, "score": score,
              "seconds": round(time.monotonic() - start, 1), "checks": checks}
    return {**report, "error": error} if error else report
