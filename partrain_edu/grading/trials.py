"""Fresh inputs for every grading run: one seed per run, from which both halves of a check draw the same
configurations (shapes, world sizes, sub-groups, caps, budgets).

A check that graded one setup the learner can see could be passed by an answer hard-coded to it, or by a table of
values copied from its own failure messages. So each run of a check draws a new seed (`fresh_seed`), and its observe
half (on the ranks) and verify half (in the trusted caller) each rebuild the run's configurations from it with
`stream(seed, what)`; the caller never trusts the ranks to say which configuration they ran. A failure names its
seed, so `check(name, ..., seed=S)` grades the very same configurations again while the learner debugs.
"""
from __future__ import annotations

import random
import secrets


def fresh_seed() -> int:
    """A seed no one can predict, short enough to type back into `check(..., seed=S)`."""
    return secrets.randbelow(1_000_000)


def stream(seed: int, what: str) -> random.Random:
    """The random stream `what` of run `seed`: the same on every rank and in the caller (str seeds are hashed
    with SHA-512 by `random.Random`, so they do not depend on PYTHONHASHSEED)."""
    return random.Random(f"{what}:{seed}")


def again(name: str, seed: int) -> str:
    """The line a failure ends with: how to grade the same configurations again."""
    return f"(inputs drawn with seed {seed}: check({name!r}, ..., seed={seed}) grades the same ones again)"


def partitions(rng: random.Random, ranks: int = 4) -> list[tuple[tuple[int, ...], ...]]:
    """Three ways to split `ranks` ranks into groups that run at once: all of them; a group of ranks − 1 beside
    one alone; two pairs (one of them without rank 0). An answer that ignores `group` gets a wrong value, not a
    hang, and every run grades a group that does not start at rank 0."""
    alone = rng.randrange(ranks)
    pair = rng.choice([(0, r) for r in range(1, ranks)])
    return [(tuple(range(ranks)),),
            (tuple(r for r in range(ranks) if r != alone), (alone,)),
            (pair, tuple(r for r in range(ranks) if r not in pair))]
