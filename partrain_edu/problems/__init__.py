"""Problem sets: numeric questions with numbers drawn per learner, graded against the course's own functions.

| file | what |
|---|---|
| `core.py` | `Problem`, `Drawn`, the `@problem` registry, the hint: a known slip, else the factor an answer is off by |
| `bank.py` | every chapter's problems; `get`, `draw(id, seed)`, `grade(id, seed, answer)` |
| `chNN_*.py` | one chapter's problems, each a function of a seeded `random.Random` returning its `Drawn` |
| `sheet.py` | a chapter's problems in its notebook: `problem_set("03", seed=1)`, `sheet.check({1: 12.5, ...})` |
| `cli.py` | `partrain-edu problems list / show / grade / export` (`--seed`, `--json`) |
| `export.py` | a class set as an nbgrader source notebook: the graded cells call `grade` |

No key is typed by hand: each is computed by `theory/` (memory, traffic, schedules, FLOPs, the network model),
and `tests/test_problems_*.py` recompute every key independently for several seeds.
"""
from partrain_edu.problems.sheet import problem_set

__all__ = ["problem_set"]
