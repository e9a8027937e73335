"""Generate exercises/ from solutions/: every answer between nbgrader's markers becomes a NotImplementedError;
and the grader's manifest (`grading/manifest.py`): which checks grade each exercise, with which functions.

    python -m partrain_edu.grading.make_exercises            # rewrite exercises/ and the manifest (never by hand)
    python -m partrain_edu.grading.make_exercises --check    # exit 1 when either is out of date

In each code cell, the lines from `### BEGIN SOLUTION` to `### END SOLUTION` (both included) are replaced by
`# YOUR CODE HERE` and `raise NotImplementedError(...)` at the marker's indentation, so a function keeps its
signature and docstring and stays valid Python; every output and execution count is cleared. The markers are
nbgrader's, so instructors who use nbgrader can take solutions/ as they are.

The manifest lists every `check("name", function, ...)` call of each solution: `partrain-edu check` grades a
submission against it — the instructor's copy — so a submission whose check cell was deleted still owes it.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = Path(__file__).resolve().parent / "manifest.py"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MESSAGE = "write your answer here, then run the check below"


def strip_solution(source: str) -> str:
    """The cell's source with each marked answer replaced; a ValueError names an unbalanced marker."""
    out, inside = [], False
    for number, line in enumerate(source.split("\n"), 1):
        stripped = line.strip()
        if stripped == BEGIN:
            if inside:
                raise ValueError(f"line {number}: {BEGIN} inside another answer; close it with {END} first")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out += [f"{indent}# YOUR CODE HERE", f'{indent}raise NotImplementedError("{MESSAGE}")']
        elif stripped == END:
            if not inside:
                raise ValueError(f"line {number}: {END} without a {BEGIN} before it")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{BEGIN} is never closed: add {END} after the answer")
    return "\n".join(out)


def make_exercise(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.from_dict(solution)  # a copy
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            try:
                cell.source = strip_solution(cell.source)
            except ValueError as err:
                raise ValueError(f"cell {i}: {err}") from None
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)
    return nb


def render(solution_path: Path) -> str:
    return nbformat.writes(make_exercise(nbformat.read(solution_path, as_version=4))) + "\n"


def checks_in(solution: nbformat.NotebookNode) -> list[tuple[str, tuple[str, ...]]]:
    """Each top-level `check("name", fn, ...)` call of the notebook's code cells: (name, the functions' names)."""
    found = []
    for i, cell in enumerate(solution.cells):
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError as err:
            raise ValueError(f"cell {i} is not plain Python ({err.msg}): the manifest reads check calls from it")
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"):
                continue
            name, *functions = node.args or [None]
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and functions
                    and all(isinstance(f, ast.Name) for f in functions)):
                raise ValueError(f'cell {i}: write the check as check("name", your_function, ...) with plain names')
            found.append((name.value, tuple(f.id for f in functions)))
    return found


def render_manifest(solutions: list[Path]) -> str:
    lines = ['"""Which checks grade each exercise, and with which of the learner\'s functions (by name) — generated',
             "from the check(...) calls in solutions/ by `python -m partrain_edu.grading.make_exercises`; never edit.",
             "",
             "`partrain-edu check` takes the checks that count from here, the instructor's copy, never from a",
             'submission (grader.py)."""', "",
             "EXERCISES: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {"]
    for path in solutions:
        try:
            calls = checks_in(nbformat.read(path, as_version=4))
        except ValueError as err:
            raise ValueError(f"{path.name}: {err}") from None
        lines.append(f"    {path.stem!r}: (")
        lines += [f"        ({name!r}, {functions!r})," for name, functions in calls]
        lines.append("    ),")
    return "\n".join(lines + ["}", ""])


def generate(solutions: Path = ROOT / "solutions", exercises: Path = ROOT / "exercises",
             check_only: bool = False, manifest: Path = MANIFEST) -> list[str]:
    """Write (or, with check_only, compare) every exercise and the manifest; returns the names that were or
    would be changed."""
    changed = []
    text = render_manifest(sorted(solutions.glob("*.ipynb")))
    if not manifest.exists() or manifest.read_text() != text:
        changed.append(manifest.name)
        if not check_only:
            manifest.write_text(text)
    wanted = {p.name: render(p) for p in sorted(solutions.glob("*.ipynb"))}
    for name, text in wanted.items():
        target = exercises / name
        if not target.exists() or target.read_text() != text:
            changed.append(name)
            if not check_only:
                exercises.mkdir(exist_ok=True)
                target.write_text(text)
    stale = sorted(p.name for p in exercises.glob("*.ipynb") if p.name not in wanted) if exercises.exists() else []
    for name in stale:  # an exercise whose solution was removed or renamed
        changed.append(name)
        if not check_only:
            (exercises / name).unlink()
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report; exit 1 when exercises/ is stale")
    args = parser.parse_args(argv)
    changed = generate(check_only=args.check)
    if args.check and changed:
        print(f"out of date: {changed}; run python -m partrain_edu.grading.make_exercises",
              file=sys.stderr)
        return 1
    print(("updated " + ", ".join(changed)) if changed else "exercises/ and the manifest are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
