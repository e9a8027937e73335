"""The exercise checks, one module per exercise, named after its notebook: exercises/NN_<name>.ipynb is graded by
checks/<name>.py (exercise 07's, 3d_parallel, by placement_3d.py; 08's and 09's are packages, observe | verify).
Each holds the exercise's fixed inputs (made from seeds, so the ranks and the trusted verifier build the same
tensors), the observe half that runs on the ranks beside the learner's functions, and the trusted verify half
that judges those observations against values it recomputes itself — or, for an in-process check, only the
latter — and registers each check once (registry.register). `load_all()` imports them; only runner.py calls it.
"""
from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
