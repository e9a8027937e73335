"""A problem: numbers drawn from a seed, a question, and a key computed by the course's own functions.

    @problem("01.ring-all-reduce", "Bytes one rank sends in a ring all-reduce", unit="MB", kind="one step",
             formula="2(n−1)/n · S", source="Patarasuk & Yuan 2009; notebook 01")
    def _(rng):                                   # rng: random.Random seeded by (seed, problem id)
        n, S = rng.choice([4, 8, 16]), rng.randint(10, 900) * 1e6
        return Drawn(f"... {n} ranks ... {S / 1e6:.0f} MB ...", ring_bytes_sent("all_reduce", S, n) / 1e6,
                     given={"n": n, "S": S}, mistakes=[(2 * S / 1e6, "the (n−1)/n factor dropped"), ...])

`bank.draw(id, seed)` gives the same numbers for the same seed, new ones for another; `bank.grade(id, seed,
answer)` accepts an answer within the problem's relative tolerance of the key and otherwise names the likely mistake:
one of the problem's own (a value a known slip gives, matched within the same tolerance), else a factor the
answer is off by that a slip explains (2, 8 for bits and bytes, 1000s for units, 1.024ⁿ for GiB and GB). It
never states the key. The formula and its source come with every graded attempt. Nothing here imports torch.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable

KINDS = ("one step", "several steps", "judgement")


@dataclass(frozen=True)
class Drawn:
    """One problem's instance: the question with its numbers, the key, the numbers given (for the tests'
    independent computation) and the values known slips give, each with what the slip is."""
    question: str
    answer: float
    given: dict = field(default_factory=dict)
    mistakes: list[tuple[float, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Problem:
    id: str                 # "<chapter>.<name>": "01.ring-all-reduce"
    title: str
    unit: str               # what the answer is counted in: "MB", "GB", "ms", "%", "steps", "" (a ratio)
    kind: str               # one step, several steps, or judgement (a choice, answered with a number)
    formula: str
    source: str
    make: Callable[[random.Random], Drawn]
    rtol: float = 0.01      # relative: a learner rounds to three figures
    model: str = ""         # the calibrated time model's name, where the key uses it (its tolerance says why)

    @property
    def chapter(self) -> str:
        return self.id.split(".")[0]


PROBLEMS: dict[str, Problem] = {}


def problem(pid: str, title: str, *, unit: str, kind: str, formula: str, source: str, rtol: float = 0.01,
            model: str = ""):
    """Register the decorated `make(rng) -> Drawn` as problem `pid`."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def register(make: Callable[[random.Random], Drawn]) -> Callable[[random.Random], Drawn]:
        if pid in PROBLEMS:
            raise ValueError(f"problem {pid!r} is defined twice")
        PROBLEMS[pid] = Problem(pid, title, unit, kind, formula, source, make, rtol, model)
        return make

    return register


def close(value: float, key: float, rtol: float) -> bool:
    return math.isclose(value, key, rel_tol=rtol, abs_tol=rtol * 1e-9)


# Factors an answer is off by that a slip explains, when the problem's own mistakes do not match.
_FACTORS = [(2.0, "off by a factor 2: a ×2 or ÷2 forgotten or added (both halves of an all-reduce? fp16 is 2 "
                  "bytes; forward and backward?)"),
            (8.0, "off by a factor 8: bits for bytes (a 400 Gb/s link moves 50 GB/s)"),
            (1e3, "off by a factor 1000: check the unit the answer is asked in"),
            (1e6, "off by a factor 10⁶: check the unit the answer is asked in"),
            (1e9, "off by a factor 10⁹: check the unit the answer is asked in"),
            (1.024 ** 3, "off by 1.024³: GiB (2³⁰ B) for GB (10⁹ B), or the reverse"),
            (1.024 ** 2, "off by 1.024²: MiB for MB, or the reverse"),
            (1.024, "off by 1.024: KiB for KB, or the reverse")]


def told_apart(key: float, mistakes: list[tuple[float, str]], rtol: float = 0.01) -> list[tuple[float, str]]:
    """The slips whose value is more than `rtol` from the key: one closer would be graded right, so it names
    nothing (a draw may make a slip harmless, as (n−1)/n ≈ 1 for large n)."""
    return [(value, why) for value, why in mistakes if not close(value, key, rtol)]


def hint(p: Problem, drawn: Drawn, answer: float) -> str:
    """Why `answer` may be wrong: every known slip (told apart from the key) whose value it matches, else a factor
    it is off by, else the direction. Never the key."""
    slips = sorted({why for value, why in told_apart(drawn.answer, drawn.mistakes, p.rtol)
                    if close(answer, value, p.rtol)})
    if slips:
        return "Likely: " + "; or ".join(slips) + "."
    if drawn.answer and answer and (answer > 0) != (drawn.answer > 0):
        return "The sign is wrong."
    if drawn.answer and answer:
        ratio = abs(answer / drawn.answer)
        for factor, why in _FACTORS:
            if close(ratio, factor, p.rtol) or close(ratio, 1 / factor, p.rtol):
                return why[0].upper() + why[1:] + "."   # str.capitalize would lower "GB", "KiB"
        return f"Too {'high' if ratio > 1 else 'low'}: follow the formula step by step, in {p.unit or 'plain numbers'}."
    return f"Not within {p.rtol:.0%} of the answer: follow the formula step by step."
