"""Generate exercises/ from solutions/ (answers become a NotImplementedError), the grader's manifest (manifest.py:
which checks grade each exercise, with which functions) and the nbgrader cell metadata of solutions/.

    python -m partrain_edu.grading.authoring.make_exercises          # rewrite them all (never edit them by hand)
    python -m partrain_edu.grading.authoring.make_exercises --check  # exit 1 when any of them is out of date

In each code cell, the lines from `### BEGIN SOLUTION` to `### END SOLUTION` (both included) become
`# YOUR CODE HERE` and `raise NotImplementedError(...)` at the marker's indentation (a function keeps its signature
and docstring and stays valid Python); every output and execution count is cleared. For nbgrader (cell metadata
schema 3) each answer cell (one with the markers) is an "autograded answer" cell and each `check(...)` cell an
"autograder tests" cell worth 1 point whose grade_id is the check's name, so nbgrader scores each check as
`partrain-edu check` does. An exercise is exactly what `nbgrader generate_assignment` releases from its solution
under `nbgrader_config.configure`, cell metadata included (tests/test_nbgrader.py runs nbgrader and compares).
The manifest lists every `check("name", function, ...)` call of each solution: `partrain-edu check` grades a
submission against it, the instructor's copy, so a submission whose check cell was deleted still owes it.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[3]
MANIFEST = Path(__file__).resolve().parent / "manifest.py"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
MESSAGE = "write your answer here, then run the check below"
STUB = f'# YOUR CODE HERE\nraise NotImplementedError("{MESSAGE}")'  # nbgrader's ClearSolutions.code_stub too
OUTPUT_METADATA = ("collapsed", "scrolled", "execution")  # cleared with the outputs (nbgrader's ClearOutput too)
GRADE_ID = re.compile(r"^[a-zA-Z0-9_\-]+$")  # nbgrader's schema for grade_id


def strip_solution(source: str) -> str:
    """The cell's source with each marked answer replaced; a ValueError names an unbalanced marker, or a line
    that nbgrader would take for one (it looks for the words anywhere in a line)."""
    out, inside = [], False
    for number, line in enumerate(source.split("\n"), 1):
        stripped = line.strip()
        if stripped not in (BEGIN, END) and (_words(BEGIN) in line or _words(END) in line):
            raise ValueError(f"line {number}: a marker ({BEGIN} or {END}) must stand alone on its line")
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


def _words(marker: str) -> str:
    return marker.lstrip("# ")


def _has_marker(source: str) -> bool:
    return _words(BEGIN) in source or _words(END) in source


def _check_calls(i: int, cell) -> list[tuple[str, tuple[str, ...]]]:
    """Every `check("name", fn, ...)` call in code cell `i`: (name, the functions' names)."""
    try:
        tree = ast.parse(cell.source)
    except SyntaxError as err:
        raise ValueError(f"cell {i} is not plain Python ({err.msg}): the manifest reads check calls from it") from err
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"):
            continue
        name, *functions = node.args or [None]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str) and functions
                and all(isinstance(f, ast.Name) for f in functions)):
            raise ValueError(f'cell {i}: write the check as check("name", your_function, ...) with plain names')
        found.append((name.value, tuple(f.id for f in functions)))
    return found


def _answer_id(i: int, cell) -> str:
    """`answer_` and the first function (or class) the answer cell defines; else its position."""
    try:
        tree = ast.parse(strip_solution(cell.source))
    except SyntaxError as err:
        raise ValueError(f"cell {i} is not plain Python ({err.msg})") from None
    except ValueError as err:
        raise ValueError(f"cell {i}: {err}") from None
    names = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return f"answer_{names[0] if names else f'cell_{i}'}"


def nbgrader_metadata(solution: nbformat.NotebookNode) -> list[dict | None]:
    """The nbgrader cell metadata (schema 3) each cell of a solution should carry: an answer cell (one with the
    markers) is nbgrader's "autograded answer", a cell with a `check(...)` call its "autograder tests" worth
    1 point, named after the check (nbgrader then scores each check alone, as `partrain-edu check` does); any
    other cell, none. A ValueError says what nbgrader could not take."""
    wanted, ids = [], {}
    for i, cell in enumerate(solution.cells):
        meta = None
        if cell.cell_type != "code":
            if _has_marker(cell.source):
                raise ValueError(f"cell {i}: answer markers belong in code cells (nbgrader would blank this "
                                 f"{cell.cell_type} cell)")
        else:
            answer, checks = _has_marker(cell.source), _check_calls(i, cell)
            if answer and checks:
                raise ValueError(f"cell {i}: put check(...) in a cell of its own, after the answer")
            if len(checks) > 1:
                raise ValueError(f"cell {i}: one check(...) per cell, so that nbgrader scores each check alone")
            if answer:
                meta = {"grade": False, "grade_id": _answer_id(i, cell), "locked": False,
                        "schema_version": 3, "solution": True, "task": False}
            elif checks:
                meta = {"grade": True, "grade_id": checks[0][0], "locked": True, "points": 1,
                        "schema_version": 3, "solution": False, "task": False}
        if meta is not None:
            if not GRADE_ID.match(meta["grade_id"]):
                raise ValueError(f"cell {i}: nbgrader names a cell with letters, digits, _ and - only, "
                                 f"not {meta['grade_id']!r}")
            if meta["grade_id"] in ids:
                raise ValueError(f"cells {ids[meta['grade_id']]} and {i} would both be nbgrader's "
                                 f"{meta['grade_id']!r}: rename one")
            ids[meta["grade_id"]] = i
        wanted.append(meta)
    return wanted


def mark_for_nbgrader(solution: nbformat.NotebookNode) -> bool:
    """Write the nbgrader metadata of every cell (and remove it where a cell no longer needs it), in place;
    True when anything changed."""
    changed = False
    for cell, meta in zip(solution.cells, nbgrader_metadata(solution), strict=True):
        if cell.metadata.get("nbgrader") != meta:
            changed = True
            if meta is None:
                del cell.metadata["nbgrader"]
            else:
                cell.metadata["nbgrader"] = nbformat.from_dict(meta)
    return changed


def _checksum(cell) -> str:
    """nbgrader's checksum of a released cell (nbgrader.utils.compute_checksum, 0.9.6): what its autograder
    compares a submitted locked cell with. The test runs nbgrader and compares."""
    meta = cell.metadata.nbgrader
    parts = [cell.source, cell.cell_type, str(meta["grade"]), str(meta["solution"]),
             str(not meta["solution"] and (meta["grade"] or meta["locked"])), meta["grade_id"]]
    if meta["grade"]:
        parts.append(str(float(meta["points"])))
    md5 = hashlib.md5()
    for part in parts:
        md5.update(part.encode("utf-8"))
    return md5.hexdigest()


def make_exercise(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """What nbgrader's generate_assignment releases from `solution` under nbgrader_config.configure."""
    nb = nbformat.from_dict(solution)  # a copy
    mark_for_nbgrader(nb)
    nb.metadata.pop("celltoolbar", None)  # nbgrader's own toolbar setting, never a learner's
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            try:
                cell.source = strip_solution(cell.source)
            except ValueError as err:
                raise ValueError(f"cell {i}: {err}") from None
            cell.outputs, cell.execution_count = [], None
            for field in OUTPUT_METADATA:
                cell.metadata.pop(field, None)
        meta = cell.metadata.get("nbgrader")
        if meta is None:
            continue
        # nbgrader locks what it grades: an answer cell cannot be deleted, a check cell cannot be changed
        # either (its autograder would put the instructor's back anyway).
        cell.metadata["deletable"] = False
        if meta["grade"]:
            cell.metadata["editable"] = False
        meta["checksum"], meta["cell_type"] = _checksum(cell), cell.cell_type
    return nb


def render(solution_path: Path) -> str:
    return nbformat.writes(make_exercise(nbformat.read(solution_path, as_version=4))) + "\n"


def checks_in(solution: nbformat.NotebookNode) -> list[tuple[str, tuple[str, ...]]]:
    """Each `check("name", fn, ...)` call of the notebook's code cells: (name, the functions' names)."""
    return [call for i, cell in enumerate(solution.cells) if cell.cell_type == "code"
            for call in _check_calls(i, cell)]


def refresh_solution(path: Path, check_only: bool = False) -> bool:
    """Give the solution notebook at `path` its nbgrader metadata (with check_only, only say whether it lacks
    any); True when it was or would be changed. Nothing else in the file changes."""
    nb = nbformat.read(path, as_version=4)
    try:
        changed = mark_for_nbgrader(nb)
    except ValueError as err:
        raise ValueError(f"{path.name}: {err}") from None
    if changed and not check_only:
        path.write_text(nbformat.writes(nb) + "\n")
    return changed


def render_manifest(solutions: list[Path]) -> str:
    lines = ['"""Which checks grade each exercise, and with which of the learner\'s functions (by name) — generated',
             "from the check(...) calls in solutions/ by "
             "`python -m partrain_edu.grading.authoring.make_exercises`; never edit.",
             "",
             "`partrain-edu check` takes the checks that count from here, the instructor's copy, never from a",
             'submission (headless/grader.py)."""', "",
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
    """Write (or, with check_only, compare) every solution's nbgrader metadata, every exercise and the
    manifest; returns the names that were or would be changed (a solution as solutions/NAME)."""
    changed = [f"{solutions.name}/{p.name}" for p in sorted(solutions.glob("*.ipynb"))
               if refresh_solution(p, check_only)]
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
    parser.add_argument("--check", action="store_true", help="only report; exit 1 when anything is stale")
    args = parser.parse_args(argv)
    changed = generate(check_only=args.check)
    if args.check and changed:
        print(f"out of date: {changed}; run python -m partrain_edu.grading.authoring.make_exercises",
              file=sys.stderr)
        return 1
    print(("updated " + ", ".join(changed)) if changed else
          "exercises/, the manifest and solutions/' nbgrader metadata are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
