"""The learner's function as the checks take it: its source text (`Source`), which is what travels to the ranks
and from the grading kernel to the grader, and whether it is still unanswered (its body only raises
NotImplementedError, as generated), which a check says at once instead of launching ranks that would all raise.
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from typing import Any

from partrain_edu.grading.registry import LearnerError, not_implemented


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
    """The message of a function whose body is still only `raise NotImplementedError(...)`, or None."""
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
