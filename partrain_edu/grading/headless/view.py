"""What the sandbox shows of the course's own implementation: only the helpers grading needs, never an answer.

The sandbox (jail.py) covers each of HIDDEN — the packages that implement what the exercises ask for — with a
read-only folder written here: an empty `__init__.py` and, for the modules of EXPOSED, a copy holding only the
named definitions and what they use (found in the module's syntax tree), so `from partrain_edu.parallel.ring
import chunk_bounds` works in a submission and on its ranks while `ring_all_reduce` exists nowhere in the
sandbox: not as a module, not in sys.modules, not as a file to read or exec (nor, EMPTIED, a check's own
reference). EXPOSED is `imports.ALLOWED`'s part of these packages plus what the checks' own sandboxed halves
import (the ring's byte count, the parameter count and device table of exercise 13) and the ring formula the
comm cost rules use; none solves an exercise.
"""
from __future__ import annotations

import ast
from pathlib import Path

import partrain_edu

PACKAGE = Path(partrain_edu.__file__).resolve().parent
HIDDEN = ("theory", "parallel", "strategies", "emulated", "lessons")
EXPOSED: dict[str, tuple[str, ...]] = {
    "parallel.ring": ("chunk_bounds", "ring_bytes_sent_by"),
    "parallel.buckets": ("plan_buckets",),
    "parallel.saved_bytes": ("SavedBytes",),
    "theory.schedules": ("simulate", "Action", "Schedule"),
    "theory.memory": ("gpt_param_count",),
    "theory.hardware": ("DEVICES",),
    "theory.traffic": ("ring_bytes_sent",),   # comm.costs prices the ranks' collectives with it
}
# The trusted halves of an in-process check whose very text states the answer (exercise 13's check and the closed
# forms of its reference): the sandbox never runs them, so each gets an empty file there (its ranks and kernel
# import every checks module, find nothing). Nothing that runs in the sandbox may import a name from them.
EMPTIED = ("grading/checks/communication_bounds.py", "grading/checks/communication_bounds_reference.py")


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return {n.id for t in targets if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}


def _used(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}   # not strings: a docstring names answers


def extract(source: str, names: tuple[str, ...]) -> str:
    """`source` cut down to its imports and the top-level definitions of `names` and of what they use; a
    course import among them would fail in the sandbox, which tests/test_grading_view.py catches."""
    tree = ast.parse(source)
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    defs = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                                    ast.Assign, ast.AnnAssign))]
    wanted, keep = set(names), set()
    while True:
        grow = {i for i, n in enumerate(defs) if _defined(n) & wanted} - keep
        if not grow:
            break
        keep |= grow
        for i in grow:
            wanted |= _used(defs[i])
    missing = set(names) - {name for i in keep for name in _defined(defs[i])}
    if missing:
        raise ValueError(f"the sandbox view cannot find {', '.join(sorted(missing))}")
    body = imports + [n for i, n in enumerate(defs) if i in keep]
    return ast.unparse(ast.Module(body=sorted(body, key=lambda n: n.lineno), type_ignores=[])) + "\n"


def build(dest: Path) -> list[tuple[str, str]]:
    """Write the view under `dest`; (what was written, the package folder or file it covers), for each of
    HIDDEN and EMPTIED."""
    covers = []
    for package in HIDDEN:
        folder = dest / package
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text("")
        covers.append((str(folder), str(PACKAGE / package)))
    for module, names in EXPOSED.items():
        original = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
        dest.joinpath(*module.split(".")).with_suffix(".py").write_text(extract(original.read_text(), names))
    for name in EMPTIED:   # the file, and its folder's bytecode cache (a .pyc holds the same code)
        empty = dest / "emptied" / name.replace("/", "__")
        empty.parent.mkdir(exist_ok=True)
        empty.write_text("")
        covers.append((str(empty), str(PACKAGE / name)))
        cache = PACKAGE / Path(name).parent / "__pycache__"
        try:
            cache.mkdir(exist_ok=True)   # so that a cache written later is covered too
        except OSError:   # a package nobody can write has no cache to come
            pass
        if cache.is_dir() and str(cache) not in {covered for _, covered in covers}:   # one cover per folder
            (empty.parent / f"{empty.stem}__pycache__").mkdir(exist_ok=True)
            covers.append((str(empty.parent / f"{empty.stem}__pycache__"), str(cache)))
    for path in dest.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return covers
