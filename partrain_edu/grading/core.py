"""The check registry, the in-process / on-N-ranks runner, and the pass/fail report.

A check is registered with `@register(name, nproc=N)`. In-process checks (nproc 0) are called with the
learner's objects and return a list of problems (strings; empty = pass); they call the learner's functions with
plain data only (ints, lists, dicts) and read plain data back, so that `partrain-edu check` can run them in the
grader while the learner's functions run in a sandbox (grader.py). A multi-rank check has two halves: its
observe half (rank_observe.py) runs the learner's functions, sent as source code (`Source`), on the ranks and
publishes plain observations; its registered verify half (rank_verify.py) runs here, in the caller, and judges
them against values it recomputes itself (observations.verify) — nothing a rank says is a verdict. A rank that
raises (the exercise's NotImplementedError, a TypeError) or a run that hangs becomes a problem naming the rank.
A failed `check` shows only the learner's problems: no traceback through this file.
"""
from __future__ import annotations

import ast
import contextlib
import inspect
import signal
import textwrap
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

DEFAULT_TIMEOUT_S = 60.0
_deferred = False  # set by the grading kernel (kernel.py): there the grader runs every check itself, afterwards


@dataclass
class CheckResult:
    name: str
    passed: bool
    message: str
    details: dict = field(default_factory=dict)


WRAP_COLUMNS = 100  # narrower than a JupyterLab cell at its default font


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


class LearnerError(Exception):
    """A rank failed or hung, or the learner's code misbehaved; the message is already worded for the learner."""


@dataclass(frozen=True)
class _Check:
    name: str
    nproc: int                   # 0: in-process; otherwise the number of ranks it runs on
    arity: int                   # how many learner objects it takes
    fn: Callable                 # in-process: fn(*objects); multi-rank: the verify half, fn(rank, n, observed)
    summary: str                 # what a pass means, printed on success
    deadlock_hint: str = ""      # the likely mismatch when the ranks time out


CHECKS: dict[str, _Check] = {}


def register(name: str, *, nproc: int = 0, arity: int = 1, summary: str, deadlock_hint: str = ""):
    def wrap(fn: Callable) -> Callable:
        CHECKS[name] = _Check(name, nproc, arity, fn, summary, deadlock_hint)
        return fn
    return wrap


def _load_checks() -> None:
    # Importing registers the checks; done lazily so `import partrain_edu.grading` stays light.
    from partrain_edu.grading import checks, local_checks, rank_verify  # noqa: F401
    checks.load_all()


def check_names() -> list[str]:
    """Every registered check, sorted (loads them)."""
    _load_checks()
    return sorted(CHECKS)


def not_implemented(exc: BaseException | str) -> str:
    return (f"not implemented yet: {exc or 'the answer cell still raises NotImplementedError'} — "
            "replace the `raise NotImplementedError(...)` line with your code")


def spec_of(name: str, count: int) -> _Check:
    """The registered check `name`, after making sure it takes `count` learner functions."""
    _load_checks()
    if name not in CHECKS:
        raise ValueError(f"unknown check {name!r}; pick one of: {', '.join(check_names())}")
    spec = CHECKS[name]
    if count != spec.arity:
        raise ValueError(f"check {name!r} takes {spec.arity} function(s) of yours, got {count}")
    return spec


def run_check(name: str, *objects: Any, timeout: float | None = None) -> CheckResult:
    """Grade without raising: the CheckResult of check `name` on the learner's `objects`."""
    spec = spec_of(name, len(objects))
    limit = timeout or DEFAULT_TIMEOUT_S
    refused = course_imports(objects)
    if refused:
        return graded(spec, lambda: [refused])
    if spec.nproc == 0:
        def run() -> list[str]:
            with time_limit(limit, name):
                return spec.fn(*objects)
        return graded(spec, run)
    return graded(spec, lambda: _run_on_ranks(spec, objects, limit))


def course_imports(objects: tuple) -> str | None:
    """Why the learner's functions may not be graded because they are or use the course's own implementation
    (imports.py), or None."""
    from partrain_edu.grading.imports import allowed, allowed_text, refusal, refusal_of

    for obj in objects:
        name = getattr(obj, "name", None) or getattr(obj, "__name__", "your function")
        if isinstance(obj, Source):
            found = refusal(obj.text, name)
        elif not allowed(getattr(obj, "__module__", None) or "", name):
            found = f"{name} is the course's own ({obj.__module__}.{name}): {allowed_text()}"
        else:
            try:
                found = refusal(source_of(obj).text, name)
            except LearnerError:
                found = None  # no source (a lambda): said by the check itself where it needs one
            found = found or refusal_of(obj, name)
        if found:
            return found
    return None


def graded(spec: _Check, run: Callable[[], list[str]]) -> CheckResult:
    """The verdict of `run()` (the check's problems), with the learner's errors turned into problems."""
    try:
        problems = run()
    except NotImplementedError as exc:
        problems = [not_implemented(exc)]
    except LearnerError as exc:
        problems = [str(exc)]
    except Exception as exc:  # the learner's code crashed in-process: report it, do not kill the kernel
        problems = [f"your code raised {type(exc).__name__}: {exc}"]
    if problems:
        return CheckResult(spec.name, False, f"✗ {spec.name} failed:\n  - " + "\n  - ".join(problems),
                           {"problems": problems})
    return CheckResult(spec.name, True, f"✓ {spec.name} passed: {spec.summary}")


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


def check(name: str, *objects: Any, timeout: float | None = None) -> None:
    """Grade the learner's `objects` with check `name`: print a pass, or raise CheckFailed (an AssertionError)
    that says why.
    Returns nothing, so a notebook cell shows only the verdict (`run_check` returns the CheckResult)."""
    if _deferred:
        print(f"check {name!r}: the grader runs it after your notebook")
        return
    result = run_check(name, *objects, timeout=timeout)
    if not result.passed:
        raise CheckFailed(result.message)
    print(result.message)


def defer_checks() -> None:
    """Make `check` a no-op in this process (the grading kernel's): the grader runs the checks itself."""
    global _deferred
    _deferred = True


# --- running a check on N ranks -------------------------------------------------------------------------

@dataclass(frozen=True)
class Source:
    """A learner's function as text: what travels to the ranks (and from the grading kernel to the grader)."""
    name: str
    text: str


def source_of(obj: Any) -> Source:
    """The source of a learner's function (a notebook cell's function works: IPython keeps cells in linecache)."""
    if isinstance(obj, Source):
        return Source(obj.name, textwrap.dedent(obj.text))
    if not callable(obj):
        raise LearnerError(f"expected one of your functions, got {type(obj).__name__} {obj!r}")
    if getattr(obj, "__name__", "") == "<lambda>":
        raise LearnerError("a lambda cannot travel to the ranks: define your function with `def`")
    try:
        return Source(obj.__name__, textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, AttributeError) as exc:
        raise LearnerError(f"cannot read the source of {getattr(obj, '__name__', obj)!r} ({exc}); "
                           "define it with `def` in a notebook cell or a .py file") from None


def _unanswered(source: str) -> str | None:
    """The message of a function whose body is still only `raise NotImplementedError(...)` (an exercise as
    generated), so a check can say so at once instead of launching ranks that would all raise it."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Raise) and body[0].exc is not None:
        exc = body[0].exc
        call = exc.func if isinstance(exc, ast.Call) else exc
        if isinstance(call, ast.Name) and call.id == "NotImplementedError":
            args = exc.args if isinstance(exc, ast.Call) else []
            return args[0].value if args and isinstance(args[0], ast.Constant) else ""
    return None


def unanswered(source: Source) -> str | None:
    """The learner-facing failure of a function still as generated (its body only raises
    NotImplementedError), or None: said at once, instead of launching ranks that would all raise it."""
    message = _unanswered(source.text)
    return None if message is None else f"{source.name}: " + not_implemented(message)


def _run_on_ranks(spec: _Check, objects: tuple, timeout: float) -> list[str]:
    from partrain_edu.grading.observations import verify
    from partrain_edu.grading.rank_launch import observe_on_ranks

    sources = [source_of(obj) for obj in objects]
    for source in sources:
        message = unanswered(source)
        if message is not None:
            return [message]
    return verify(spec, observe_on_ranks(spec, sources, timeout))
