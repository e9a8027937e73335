"""Running a check: in process, or on N ranks, to a pass/fail report. The only module that loads checks/.

`check(name, *functions)` prints a pass or raises CheckFailed; `run_check` returns the CheckResult. A learner's
function that imports the course's own implementation is refused first (imports.py). An in-process check calls
the learner's objects under a time limit; a multi-rank check sends their source to the ranks (on_ranks.py), which
only observe, and judges what they publish here (observations.verify): nothing a rank says is a verdict. A rank
that raises (the exercise's NotImplementedError, a TypeError) or a run that hangs becomes a problem naming the
rank. A failed `check` shows only the learner's problems: no traceback through this file.
"""
from __future__ import annotations

import contextlib
import signal
import threading
from typing import Any, Callable

from partrain_edu.grading.imports import course_imports
from partrain_edu.grading.learner_code import source_of, unanswered
from partrain_edu.grading.registry import CHECKS, Check, CheckFailed, CheckResult, LearnerError, not_implemented
from partrain_edu.grading.trials import again, fresh_seed

DEFAULT_TIMEOUT_S = 60.0
_deferred = False  # set by the grading kernel (headless/kernel.py): there the grader runs every check afterwards


def load_checks() -> None:
    """Import checks/ (each module registers its checks); lazily, so `import partrain_edu.grading` stays light."""
    from partrain_edu.grading.checks import load_all

    load_all()


def check_names() -> list[str]:
    """Every registered check, sorted (loads them)."""
    load_checks()
    return sorted(CHECKS)


def spec_of(name: str, count: int) -> Check:
    """The registered check `name`, after making sure it takes `count` learner functions."""
    load_checks()
    if name not in CHECKS:
        raise ValueError(f"unknown check {name!r}; pick one of: {', '.join(check_names())}")
    spec = CHECKS[name]
    if count != spec.arity:
        raise ValueError(f"check {name!r} takes {spec.arity} function(s) of yours, got {count}")
    return spec


def run_check(name: str, *objects: Any, timeout: float | None = None, seed: int | None = None) -> CheckResult:
    """Grade without raising: the CheckResult of check `name` on the learner's `objects`, on the configurations
    drawn from `seed` (a fresh one when None: trials.py)."""
    spec = spec_of(name, len(objects))
    limit = timeout or DEFAULT_TIMEOUT_S
    seed = fresh_seed() if seed is None else seed
    refused = course_imports(objects)
    if refused:  # refused before any configuration was drawn: no seed to name
        return graded(spec, lambda: [refused])
    if spec.nproc == 0:
        def run() -> list[str]:
            with time_limit(limit, name):
                return spec.verify(*objects, seed=seed)
        return graded(spec, run, seed)
    return graded(spec, lambda: _run_on_ranks(spec, objects, limit, seed), seed)


def graded(spec: Check, run: Callable[[], list[str]], seed: int | None = None) -> CheckResult:
    """The verdict of `run()` (the check's problems on the configurations of `seed`; None: it drew none), with the
    learner's errors turned into problems."""
    try:
        problems = run()
    except NotImplementedError as exc:
        problems = [not_implemented(exc)]
    except LearnerError as exc:
        problems = [str(exc)]
    except Exception as exc:  # the learner's code crashed in-process: report it, do not kill the kernel
        problems = [f"your code raised {type(exc).__name__}: {exc}"]
    if problems:
        message = f"✗ {spec.name} failed:\n  - " + "\n  - ".join(problems)
        if seed is None:
            return CheckResult(spec.name, False, message, {"problems": problems})
        details = {"problems": problems, "seed": seed}
        return CheckResult(spec.name, False, f"{message}\n{again(spec.name, seed)}", details)
    return CheckResult(spec.name, True, f"✓ {spec.name} passed: {spec.summary}", {"seed": seed})


@contextlib.contextmanager
def time_limit(seconds: float, name: str):
    """Stop an in-process check whose learner code loops forever (SIGALRM; only in the main thread on Unix)."""
    usable = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expired(signum, frame):
        raise LearnerError(f"your code ran longer than {seconds:g} s: an endless loop? (check {name!r})")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(name: str, *objects: Any, timeout: float | None = None, seed: int | None = None) -> None:
    """Grade the learner's `objects` with check `name` on fresh configurations (or those of `seed`): print a
    pass, or raise CheckFailed (an AssertionError) that says why.
    Returns nothing, so a notebook cell shows only the verdict (`run_check` returns the CheckResult)."""
    if _deferred:
        print(f"check {name!r}: the grader runs it after your notebook")
        return
    result = run_check(name, *objects, timeout=timeout, seed=seed)
    if not result.passed:
        raise CheckFailed(result.message)
    print(result.message)


def defer_checks() -> None:
    """Make `check` a no-op in this process (the grading kernel's): the grader runs the checks itself."""
    global _deferred
    _deferred = True


def _run_on_ranks(spec: Check, objects: tuple, timeout: float, seed: int) -> list[str]:
    from partrain_edu.grading.observations import verify
    from partrain_edu.grading.on_ranks import observe_on_ranks

    sources = [source_of(obj) for obj in objects]
    for source in sources:
        message = unanswered(source)
        if message is not None:
            return [message]
    return verify(spec, observe_on_ranks(spec, sources, timeout, seed), seed)
