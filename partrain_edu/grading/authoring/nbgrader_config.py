"""The course for instructors who grade with nbgrader (https://nbgrader.readthedocs.io): solutions/ are nbgrader
source notebooks, and under these settings `nbgrader generate_assignment` releases exactly exercises/ and
`nbgrader autograde` scores each check cell as `partrain-edu check` scores that check (tests/test_nbgrader.py).

    python -m partrain_edu.grading.authoring.nbgrader_config COURSE
        # COURSE/source/<exercise>/<exercise>.ipynb for each solution, and COURSE/nbgrader_config.py
    cd COURSE
    nbgrader generate_assignment 01_ring_all_reduce   # release/01_ring_all_reduce/: the notebook in exercises/
    nbgrader autograde 01_ring_all_reduce             # submitted/<student>/01_ring_all_reduce/ -> gradebook.db

Run nbgrader from the course's activated venv (`source .venv/bin/activate`): it starts `alembic` from PATH when
it creates the gradebook, and each submission's kernel must import partrain_edu. Each check cell is worth 1 point,
named (grade_id) after its check. nbgrader runs a submission's cells, the checks included, in one kernel, as the
learner did: use it for honest work. `partrain-edu check` is the grader that a submission cannot talk into a pass
(a sandbox, the instructor's list of checks, the course's own code refused); it also writes the CSV.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from partrain_edu.grading.authoring.make_exercises import BEGIN, END, OUTPUT_METADATA, ROOT, STUB, refresh_solution

CELL_TIMEOUT_S = 600  # a multi-rank check launches ranks and waits up to its own timeout (60 s by default)

CONFIG_FILE = '''\
# nbgrader's settings for the partrain_edu course (see partrain_edu/grading/authoring/nbgrader_config.py).
from partrain_edu.grading.authoring.nbgrader_config import configure

c = get_config()  # noqa: F821 (nbgrader defines it)
configure(c)
'''


def configure(c) -> None:
    """Set nbgrader's options on config `c` so that it releases what make_exercises generates."""
    c.ClearSolutions.code_stub = {"python": STUB}
    # Only the whole marker line is a marker (nbgrader's default matches the words anywhere in any line).
    c.ClearSolutions.begin_solution_delimeter = BEGIN
    c.ClearSolutions.end_solution_delimeter = END
    # A solution executed by nbconvert keeps per-cell timings ("execution"): cleared with the outputs.
    c.ClearOutput.remove_metadata_fields = set(OUTPUT_METADATA)
    # nbgrader's default of 30 s per cell is less than a multi-rank check may take on a loaded machine.
    c.Execute.timeout = CELL_TIMEOUT_S


def lay_out(course: Path, solutions: Path = ROOT / "solutions", names: list[str] | None = None) -> list[str]:
    """Make `course` an nbgrader course directory: source/<exercise>/<exercise>.ipynb from each solution (or
    those named), with their nbgrader metadata, and nbgrader_config.py. Returns the exercises laid out."""
    paths = sorted(solutions.glob("*.ipynb")) if names is None else [solutions / f"{n}.ipynb" for n in names]
    stale = [p.name for p in paths if refresh_solution(p, check_only=True)]
    if stale:  # checked before anything is written: no half-made course
        raise ValueError(f"{', '.join(stale)} in {solutions} lack their nbgrader metadata: "
                         "run python -m partrain_edu.grading.authoring.make_exercises")
    for path in paths:
        target = course / "source" / path.stem / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (course / "nbgrader_config.py").write_text(CONFIG_FILE)
    return [p.stem for p in paths]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("course", type=Path, help="the nbgrader course directory to write (created if missing)")
    args = parser.parse_args(argv)
    try:
        names = lay_out(args.course)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    print(f"{args.course}: source/ holds {', '.join(names)}; then, in it: nbgrader generate_assignment NAME")
    return 0


if __name__ == "__main__":
    sys.exit(main())
