"""Every chapter's problems, and what the command line and the notebooks ask of them: `get`, `draw`, `grade`.

    draw("01.ring-all-reduce", seed=7).question     # the same numbers for seed 7, new ones for seed 8
    grade("01.ring-all-reduce", 7, 123.4)           # {"correct": False, "hint": "Likely: ...", "formula": ...}
"""
from __future__ import annotations

import difflib
import math
import random

from partrain_edu.problems import (  # noqa: F401  (each chapter registers its problems on import)
    ch01_collectives,
    ch02_data_parallel,
    ch03_memory_wall,
    ch04_zero_fsdp,
    ch05_tensor_parallel,
    ch06_pipeline,
    ch07_3d_parallel,
    ch08_choosing,
    ch10_context_parallel,
    ch11_fsdp_tp,
    ch12_mixed_precision,
    ch13_zero_bubble,
    ch14_moe,
    ch15_efficiency,
)
from partrain_edu.problems.core import PROBLEMS, Drawn, Problem, close, hint


def chapters() -> list[str]:
    return sorted({p.chapter for p in PROBLEMS.values()})


def of_chapter(chapter: str) -> list[Problem]:
    """The chapter's problems in the order its file defines them."""
    found = [p for p in PROBLEMS.values() if p.chapter == chapter]
    if not found:
        raise ValueError(f"no problems for chapter {chapter!r}; chapters: {', '.join(chapters())}")
    return found


def get(pid: str) -> Problem:
    """The problem `pid`, or a ValueError naming the nearest ids."""
    if pid not in PROBLEMS:
        near = difflib.get_close_matches(pid, PROBLEMS, n=3, cutoff=0)
        raise ValueError(f"no problem {pid!r}; did you mean {', '.join(near)}? (partrain-edu problems list)")
    return PROBLEMS[pid]


def draw(pid: str, seed: int) -> Drawn:
    """Problem `pid`'s instance for `seed`: a generator seeded by both, so problems never share numbers."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"--seed must be a whole number, got {seed!r}")
    return get(pid).make(random.Random(f"partrain-edu problems {seed} {pid}"))


def grade(pid: str, seed: int, answer: float) -> dict:
    """{"correct", "hint", "formula", "source", ...} for `answer` to problem `pid` drawn with `seed`; the key is
    never part of it."""
    p, drawn = get(pid), draw(pid, seed)
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
        raise ValueError(f"--answer must be a number, got {answer!r}")
    correct = close(answer, drawn.answer, p.rtol)
    return {"id": pid, "seed": seed, "answer": answer, "unit": p.unit, "correct": correct,
            "hint": None if correct else hint(p, drawn, answer), "tolerance": p.rtol, "formula": p.formula,
            "source": p.source}
