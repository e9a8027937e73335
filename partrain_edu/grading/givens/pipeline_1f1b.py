"""Handed out by exercise 06 (a 1F1B schedule): `as_schedule` turns the learner's per-stage lists into a
`theory.schedules.Schedule`, which the handed-out `simulate` runs — so the notebook and the check simulate
the same thing. Not the answer: choosing the order is.
"""
from __future__ import annotations

from partrain_edu.theory.schedules import Action, Schedule  # the sandbox's view has these


def as_schedule(lists, p: int, m: int) -> Schedule:
    """A learner's per-stage lists of ("F", i) / ("B", i) pairs as a `theory.schedules.Schedule` to simulate."""
    actions = []
    for stage in lists:
        acts = []
        for item in stage:
            kind, mb = item
            acts.append(Action(str(kind), int(mb)))
        actions.append(tuple(acts))
    return Schedule("yours", p, m, 1, tuple(actions))
