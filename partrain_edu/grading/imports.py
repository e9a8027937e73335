"""What graded code may use of the course: an exercise is passed by writing the algorithm, not by importing the
course's own implementation of it (`from partrain_edu.parallel.ring import ring_all_reduce`).

`ALLOWED` lists the few names of `partrain_edu` an exercise notebook may import: the `check` itself, the helpers
an exercise hands out (chunk boundaries, the schedule simulator, send/recv helpers), and display tools. Two
places apply it:
- `refusal(source)`: the AST of a graded function's source (or of a notebook's code cell) — an import of any
  other `partrain_edu` name, `__import__`/`importlib`, or a string naming the package is refused;
- `refusal_of(fn)`: also the globals a live function reads (a name imported in another cell).
Each returns one line for the learner — what was used, where, and what is allowed — or None. This is the
first, friendly refusal of the honest shortcut; code written to dodge it (a computed name) finds, in the
grader's sandbox, no answer to import: the package's view there (headless/view.py) holds only the helpers above.
`course_imports(objects)` applies both to the objects a check is given.
"""
from __future__ import annotations

import ast
import types
from typing import Any

from partrain_edu.grading.learner_code import Source, source_of
from partrain_edu.grading.registry import LearnerError

PACKAGE = "partrain_edu"
# module -> names an exercise may import from it ("*": the whole module; none of these solves an exercise)
ALLOWED: dict[str, set[str]] = {
    "partrain_edu.grading": {"check"},
    "partrain_edu.grading.givens": {"*"},           # what exercises hand out (givens/)
    "partrain_edu.parallel.ring": {"chunk_bounds"},
    "partrain_edu.parallel.saved_bytes": {"SavedBytes"},  # exercise 10's meter (a given): measures, decides nothing
    "partrain_edu.parallel.buckets": {"plan_buckets"},  # exercise 2 shows the plan; the hooks are the answer
    "partrain_edu.theory.schedules": {"simulate", "Action", "Schedule"},
    "partrain_edu.units": {"*"},
    "partrain_edu.viz": {"*"},
}
DYNAMIC = {"__import__", "import_module", "exec", "eval", "compile"}


def allowed(module: str, name: str = "*") -> bool:
    """May graded code import `name` from `module`? Non-course modules always."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return True
    names = next((v for m, v in ALLOWED.items() if module == m or (module.startswith(m + ".") and "*" in v)), set())
    return "*" in names or name in names


def allowed_text() -> str:
    names = sorted(n if n != "*" else m.replace(PACKAGE + ".", "") + ".*" for m, ns in ALLOWED.items() for n in ns)
    return (f"an exercise is passed by writing the algorithm with torch and torch.distributed; from {PACKAGE} it "
            f"may use only {', '.join(names)}")


def refusal(source: str, where: str = "your code") -> str | None:
    """Why `source` may not be graded (it uses the course's implementation), or None."""
    try:
        tree = ast.parse(_python(source))
    except SyntaxError:
        return None  # the check reports the syntax error itself
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if not allowed(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            bad = [f"{node.module}.{a.name}" for a in node.names if not allowed(node.module, a.name)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and PACKAGE + "." in node.value:
            bad = [repr(node.value[:60])]  # a module named in a string: sys.modules[...], getattr chains
        elif isinstance(node, (ast.Name, ast.Attribute)) and (getattr(node, "id", None) or node.attr) in DYNAMIC:
            bad = [getattr(node, "id", None) or node.attr]
        else:
            continue
        if bad:
            return f"{where}, line {line}, uses {', '.join(bad)}: {allowed_text()}"
    return None


def _python(cell: str) -> str:
    """A notebook cell as plain Python: IPython's own transform turns %magics and !commands into calls."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return cell
    return TransformerManager().transform_cell(cell)


def _filled(cell) -> bool:
    try:
        _ = cell.cell_contents  # raises ValueError while the cell is empty
    except ValueError:  # a closure variable not assigned yet
        return False
    return True


def _names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def refusal_of(fn: Any, where: str, _seen: set | None = None) -> str | None:
    """`refusal` for the course objects a live function's global and closure names resolve to, following the
    learner's own helpers (functions defined in the same notebook or module) one call deeper each."""
    code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", None)
    seen = _seen if _seen is not None else set()
    if code is None or scope is None or id(fn) in seen:
        return None
    seen.add(id(fn))
    closure = {n: c.cell_contents for n, c in zip(code.co_freevars, fn.__closure__ or (), strict=True) if _filled(c)}
    scope = {**scope, **closure}
    for name in sorted(_names(code) | set(closure)):
        if name not in scope:
            continue
        value = scope[name]
        module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "") or ""
        attr = "*" if isinstance(value, types.ModuleType) else getattr(value, "__name__", name)
        if not allowed(module, attr):
            return f"{where} uses {name} (from {module}): {allowed_text()}"
        if isinstance(value, types.FunctionType) and module == getattr(fn, "__module__", None):  # a notebook helper
            found = refusal_of(value, f"{where} (through {name})", seen)
            if found:
                return found
    return None


def course_imports(objects: tuple) -> str | None:
    """Why the learner's functions `objects` may not be graded because they are or use the course's own
    implementation, or None."""
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
