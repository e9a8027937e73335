"""The table of exercise checks, and what a check's verdict is made of. Imports nothing of the course.

Each module of checks/ registers its checks here, once each, with `register(name, ...)` on the verify half:
- an in-process check (nproc 0) is `verify(*learner_objects) -> problems`; it calls the learner's functions with
  plain data only (ints, lists, dicts) and reads plain data back, so that the headless grader can run it while
  the learner's functions run in a sandbox;
- a multi-rank check also names its `observe(ctx, *learner_functions) -> observations` half, which runs on
  `nproc` ranks beside the learner's code, and the helpers (`given`, from givens/) that code may call there;
  `verify(rank, n, observed)` then judges one rank's observations in the caller (observations.verify).
Problems are strings worded for the learner (a `Problem` also says when in the run it arose); none means a pass.
Every run draws its configurations from a fresh seed (trials.py): verify halves take `seed=`, as observe halves
do. runner.py runs the checks.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

WRAP_COLUMNS = 100  # narrower than a JupyterLab cell at its default font


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    details: dict = field(default_factory=dict)


class CheckFailed(AssertionError):
    """A failed `check`: an AssertionError for pytest and nbval, shown by IPython as its message alone."""

    def _render_traceback_(self) -> list[str]:
        # IPython (and so Jupyter) shows what this returns instead of a traceback: the frame of `check`, with
        # the checkout's absolute path, tells a learner nothing; their problem lines are the whole story. Wrapped
        # at word boundaries: JupyterLab breaks an error's long line mid-word ("nobody s / ends").
        return [part for line in str(self).splitlines()
                for part in textwrap.wrap(line, WRAP_COLUMNS, subsequent_indent=_hanging_indent(line),
                                          break_long_words=False, break_on_hyphens=False) or [""]]


def _hanging_indent(line: str) -> str:
    """The indent of a wrapped line's continuation: under the text of a "- " item, else under the line."""
    lead = line[:len(line) - len(line.lstrip())]
    return lead + "  " if line.lstrip().startswith("- ") else lead


class Problem(str):
    """A problem worded for the learner that also says when in the run it arose (`at`: (step, phase, ...), any
    tuple a check orders its quantities by). Across ranks, the problem that arose first is the one told
    (observations.verify): a wrong output on rank 1 comes before the wrong gradient it causes on rank 0."""

    at: tuple

    def __new__(cls, text: str, at: tuple = ()):
        problem = super().__new__(cls, text)
        problem.at = tuple(at)
        return problem


class LearnerError(Exception):
    """A rank failed or hung, or the learner's code misbehaved; the message is already worded for the learner."""


@dataclass(frozen=True)
class Check:
    name: str
    nproc: int                   # 0: in-process; otherwise the number of ranks it runs on
    arity: int                   # how many learner objects it takes
    verify: Callable             # in-process: verify(*objects); multi-rank: verify(rank, n, observed)
    summary: str                 # what a pass means, printed on success
    deadlock_hint: str = ""      # the likely mismatch when the ranks time out
    mismatch_hint: str = ""      # the likely mistake when a message arrives with a size its receiver did not expect
    observe: Callable | None = None                          # multi-rank: observe(ctx, *learner_functions)
    given: Mapping[str, Any] = field(default_factory=dict)   # what the learner's functions may call on the ranks


CHECKS: dict[str, Check] = {}


def register(name: str, *, nproc: int = 0, arity: int = 1, summary: str, deadlock_hint: str = "",
             mismatch_hint: str = "", observe: Callable | None = None,
             given: Mapping[str, Any] | None = None) -> Callable:
    """Register check `name` with the decorated function as its verify half (see the module's docstring)."""
    if (observe is None) != (nproc == 0):
        raise ValueError(f"check {name!r}: a multi-rank check (nproc > 0), and only one, has an observe half")

    def wrap(verify: Callable) -> Callable:
        if name in CHECKS:
            raise ValueError(f"check {name!r} is registered twice")
        CHECKS[name] = Check(name, nproc, arity, verify, summary, deadlock_hint, mismatch_hint, observe,
                             dict(given or {}))
        return verify
    return wrap


def not_implemented(exc: BaseException | str) -> str:
    return (f"not implemented yet: {exc or 'the answer cell still raises NotImplementedError'} — "
            "replace the `raise NotImplementedError(...)` line with your code")
