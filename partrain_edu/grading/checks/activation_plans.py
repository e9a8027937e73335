"""The plans of exercise 10's check (activation_checkpointing.py), by formula: which blocks of a stack run again
in backward and under which checkpoints, the bytes a plan holds and the FLOPs it recomputes, the greedy choices a
learner may make, and the four budgets a run grades. Registers no check.

A stack of MLP blocks Linear(d_i, w_i) → GELU or ReLU → Linear(w_i, d_i+1) on `rows` rows, float32: run plainly,
block i holds 4·rows·(d_i + 2·w_i) bytes with GELU (its input and output are saved), 4·rows·(d_i + w_i) with ReLU
(its output is also the second Linear's saved input: one storage); a checkpoint holds only the input of its first
block; recomputing block i costs 2·rows·w_i·(d_i + d_i+1) FLOPs (two matmuls; FlopCounterMode counts no
activation). tests/test_exercise_activation_checkpointing.py checks these formulas against SavedBytes and
forward_flops on every plan of drawn stacks.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

Plan = tuple[tuple[int, int, bool], ...]   # segments (start, end, checkpointed), in order


@dataclass(frozen=True)
class Stack:
    rows: int
    widths: tuple[int, ...]        # d_0 .. d_n: block i maps d_i → d_i+1
    hidden: tuple[int, ...]        # w_i
    activations: tuple[str, ...]   # "gelu" or "relu"

    def plain(self, i: int) -> int:
        return 4 * self.rows * (self.widths[i] + (2 if self.activations[i] == "gelu" else 1) * self.hidden[i])

    def kept(self, i: int) -> int:
        return 4 * self.rows * self.widths[i]

    def flops(self, i: int) -> int:
        return 2 * self.rows * self.hidden[i] * (self.widths[i] + self.widths[i + 1])

    def held(self, chosen: frozenset[int], merged: bool = True) -> int:
        """Bytes held when the blocks `chosen` are recomputed: consecutive ones under one checkpoint (`merged`)
        or one checkpoint each."""
        return sum(self.plain(i) if i not in chosen else
                   self.kept(i) if not merged or i - 1 not in chosen else 0 for i in range(len(self.hidden)))

    def cost(self, chosen) -> int:
        return sum(self.flops(i) for i in chosen)

    def choices(self) -> list[frozenset[int]]:
        n = len(self.hidden)
        return [frozenset(c) for k in range(n + 1) for c in itertools.combinations(range(n), k)]

    def plans(self) -> set[Plan]:
        """Every choice of blocks to recompute, consecutive ones under one checkpoint and one checkpoint each."""
        return {plan_of(chosen, merged, len(self.hidden)) for chosen in self.choices() for merged in (False, True)}


def plan_of(chosen: frozenset[int], merged: bool, n: int) -> Plan:
    """The plan recomputing blocks `chosen`, consecutive ones under one checkpoint (`merged`: it holds only the
    first one's input, the least any plan with this choice can hold) or one each. Plain blocks form one segment:
    they hold the same either way."""
    segments: list[list] = []
    for i in range(n):
        ckpt = i in chosen
        if segments and segments[-1][2] == ckpt and (merged or not ckpt):
            segments[-1][1] = i + 1
        else:
            segments.append([i, i + 1, ckpt])
    return tuple(map(tuple, segments))


def recomputed_by(plan: Plan) -> frozenset[int]:
    return frozenset(i for start, end, ckpt in plan if ckpt for i in range(start, end))


def greedy(stack: Stack, budget: int, order: str) -> set[int] | None:
    """The blocks a greedy learner recomputes — by most "bytes saved" first, or most "bytes saved per FLOP" —
    adding one checkpoint per block until the bytes fit; None if even all of them do not."""
    saved = {i: stack.plain(i) - stack.kept(i) for i in range(len(stack.hidden))}
    key = (lambda i: saved[i]) if order == "bytes saved" else (lambda i: saved[i] / stack.flops(i))
    chosen: set[int] = set()
    for i in sorted(saved, key=key, reverse=True):
        if stack.held(frozenset(chosen), merged=False) <= budget:
            break
        chosen.add(i)
    return chosen if stack.held(frozenset(chosen), merged=False) <= budget else None


def frontier(stack: Stack) -> list[tuple[int, int]]:
    """(bytes, least FLOPs) at every budget where the least recompute that fits drops: the bytes of a plan cheaper
    than every plan holding less. From the least any plan holds (all blocks under one checkpoint) to the plain
    forward's bytes (nothing recomputed)."""
    options = sorted((stack.held(c), stack.cost(c)) for c in stack.choices())
    points: list[tuple[int, int]] = []
    for held, cost in options:
        if not points or cost < points[-1][1]:
            if points and points[-1][0] == held:
                points[-1] = (held, cost)
            else:
                points.append((held, cost))
    return points


def budgets_for(stack: Stack, rng: random.Random) -> tuple[int, ...] | None:
    """Four budgets for `stack`, in a drawn order: tight (in the lower half of the bytes, where both greedy orders
    miss the cheapest plan), exactly at a frontier point's bytes, in between, loose (≥ the plain forward's bytes);
    None when no budget defeats both greedy orders."""
    points = frontier(stack)
    lowest, plain = points[0][0], points[-1][0]
    traps = []
    for k in range(len(points) - 1):
        inside = list(range(points[k][0] + 1, points[k + 1][0]))
        for budget in rng.sample(inside, min(4, len(inside))):
            costs = [greedy(stack, budget, order) for order in ("bytes saved", "bytes saved per FLOP")]
            if all(c is None or stack.cost(c) > points[k][1] for c in costs):
                traps.append((k, budget))
                break
    low = [t for t in traps if points[t[0]][0] < (lowest + plain) / 2]
    if not traps or len(points) < 4:
        return None
    k, tight = rng.choice(low or traps)
    exact = points[rng.choice([j for j in range(1, len(points) - 1) if j != k])][0]
    between = rng.choice([b for b in range(lowest + 1, plain) if b not in (tight, exact)])
    budgets = [tight, exact, between, plain + rng.randint(0, plain // 4)]
    rng.shuffle(budgets)
    return tuple(budgets)
