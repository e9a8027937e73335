"""A chapter's problems at the end of its notebook: the questions for a seed, then the learner's answers graded.

    sheet = problem_set("03", seed=1)           # prints the questions; any other seed, new numbers
    sheet.check({1: 120.0, 2: None, 3: 7})      # ✓, or ✗ with the likely mistake; the formula after each attempt

The same seed prints the same numbers. A key is never printed: after an attempt the formula and its source are.
"""
from __future__ import annotations

import textwrap

from partrain_edu.problems.bank import draw, grade, of_chapter

WIDTH = 110


def _wrap(text: str, indent: str) -> str:
    return textwrap.fill(text, WIDTH, initial_indent=indent, subsequent_indent=" " * len(indent),
                         break_on_hyphens=False)   # a problem id such as 04.stage-bytes stays whole


class Sheet:
    """The problems of `chapter` drawn with `seed`, numbered from 1 in the chapter's order."""

    def __init__(self, chapter: str, seed: int):
        self.chapter = chapter
        self.seed = seed
        self.problems = of_chapter(chapter)
        self.drawn = [draw(p.id, seed) for p in self.problems]

    def text(self) -> str:
        lines = [f"Chapter {self.chapter}'s problems, seed {self.seed} (another seed draws new numbers; "
                 f"answers within each tolerance count):"]
        for k, (p, d) in enumerate(zip(self.problems, self.drawn, strict=True), 1):
            unit = f"answer in {p.unit}" if p.unit else "a plain number"
            lines.append(_wrap(f"{d.question} [{unit}, ±{p.rtol:.0%}; {p.kind}; {p.id}]", f"{k}. "))
        return "\n".join(lines)

    def check(self, answers: dict[int, float | None]) -> None:
        """Print each answer's verdict: ✓, ✗ with the likely mistake, or a reminder where it is still None."""
        unknown = sorted(set(answers) - set(range(1, len(self.problems) + 1)), key=str)
        if unknown:
            raise ValueError(f"no problem {unknown[0]!r} here: answer problems 1 to {len(self.problems)}")
        for k, p in enumerate(self.problems, 1):
            value = answers.get(k)
            if value is None:
                print(f"{k}. —  replace None with your answer, in {p.unit or 'plain numbers'}")
                continue
            result = grade(p.id, self.seed, value)
            verdict = "✓" if result["correct"] else f"✗ {result['hint']}"
            print(_wrap(f"{value:g} {p.unit}: {verdict}", f"{k}. "))
            print(_wrap(f"{p.formula} — {p.source}", " " * 5))

    def __repr__(self) -> str:
        return f"<{len(self.problems)} problems of chapter {self.chapter}, seed {self.seed}>"


def problem_set(chapter: str, seed: int) -> Sheet:
    """Print chapter `chapter`'s problems drawn with `seed` and return them, to `check` answers against."""
    sheet = Sheet(chapter, seed)
    print(sheet.text())
    return sheet
