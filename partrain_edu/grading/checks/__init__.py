"""The exercise checks added after the first seven, one module per exercise: its fixed inputs (made from seeds),
the observe half that runs on the ranks beside the learner's functions (`@rank_observe.observer(name)`), and
the trusted verify half that judges those observations against values it recomputes itself
(`@core.register(name, nproc=N)`) — or, for an in-process check, only the latter. `load_all()` imports them;
the registry, the grader and the ranks find them by name.
"""
from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")
