"""The `problems` subcommand of `partrain-edu`: list, show and grade the problem sets; export a class set.

    partrain-edu problems list [--chapter 03] [--json]
    partrain-edu problems show 03.zero-fits --seed 7 [--json]      # an id, or a chapter: all of its problems
    partrain-edu problems grade 03.zero-fits --seed 7 --answer 42 [--json]
    partrain-edu problems export COURSE --seed 7 [--chapter 03 ...]   # an nbgrader course (export.py)

`show --json` prints {"problems": [{"id", "title", "kind", "unit", "tolerance", "question", ...}], "seed"}: no
key. `grade --json` prints {"id", "seed", "answer", "unit", "correct", "hint", "tolerance", "formula",
"source"}; it exits 0 for a right answer and 1 for a wrong one. Bad input (an unknown id, a seed or answer that
is no number) raises ValueError: one line, exit 2 (`partrain_edu/cli.py`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from partrain_edu.problems.bank import PROBLEMS, chapters, draw, get, grade, of_chapter


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: write it plainly, as 772.5 or 7.7e2") from None


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _chapter(text: str) -> str:
    chapter = text.zfill(2)
    if chapter not in chapters():
        raise argparse.ArgumentTypeError(f"no problems for chapter {text!r}; chapters: {', '.join(chapters())}")
    return chapter


def _about(p) -> dict:
    return {"id": p.id, "chapter": p.chapter, "title": p.title, "kind": p.kind, "unit": p.unit,
            "tolerance": p.rtol, "model": p.model or None}


def cmd_list(args) -> int:
    found = of_chapter(args.chapter) if args.chapter else list(PROBLEMS.values())
    if args.json:
        print(json.dumps({"count": len(found), "chapters": sorted({p.chapter for p in found}),
                          "problems": [_about(p) for p in found]}))
        return 0
    for p in found:
        print(f"{p.id:<32} {p.kind:<13} [{p.unit or '—'}] {p.title}")
    count = len({p.chapter for p in found})
    print(f"{len(found)} problems over {count} chapter{'s' * (count != 1)}; partrain-edu problems show ID --seed N")
    return 0


def cmd_show(args) -> int:
    found = of_chapter(args.id) if args.id in chapters() else [get(args.id)]
    shown = [{**_about(p), "question": draw(p.id, args.seed).question} for p in found]
    if args.json:
        print(json.dumps({"seed": args.seed, "problems": shown}))
        return 0
    for row in shown:
        print(f"{row['id']} (seed {args.seed}; {row['kind']}; answer in {row['unit'] or 'plain numbers'}, "
              f"±{row['tolerance']:.0%}):\n  {row['question']}")
    return 0


def cmd_grade(args) -> int:
    result = grade(args.id, args.seed, args.answer)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{args.id}, seed {args.seed}: {args.answer:g} {result['unit']} "
              + ("✓" if result["correct"] else f"✗ {result['hint']}"))
        print(f"  {result['formula']} — {result['source']}")
    return 0 if result["correct"] else 1


def cmd_export(args) -> int:
    from partrain_edu.problems.export import export

    path = export(args.course, args.seed, args.chapter or chapters())
    print(f"{path}: the nbgrader source notebook; then, in {args.course}: nbgrader generate_assignment "
          f"{path.parent.name}")
    return 0


def add_subcommands(sub) -> None:
    p = sub.add_parser("problems", help="numeric problem sets: list, show, grade; export for nbgrader")
    inner = p.add_subparsers(dest="action", required=True)
    p_list = inner.add_parser("list", help="every problem: id, kind, unit, title")
    p_list.add_argument("--chapter", type=_chapter, help="only this chapter's (01, 02, ...)")
    p_list.add_argument("--json", action="store_true", help="print one JSON object")
    p_list.set_defaults(func=cmd_list)
    p_show = inner.add_parser("show", help="a problem's question (or a chapter's) with the numbers of a seed")
    p_show.add_argument("id", help="a problem id (partrain-edu problems list) or a chapter number")
    p_show.add_argument("--seed", type=_whole, required=True, help="whose numbers: any whole number")
    p_show.add_argument("--json", action="store_true", help="print one JSON object")
    p_show.set_defaults(func=cmd_show)
    p_grade = inner.add_parser("grade", help="grade an answer: right, or the likely mistake")
    p_grade.add_argument("id", help="a problem id (partrain-edu problems list)")
    p_grade.add_argument("--seed", type=_whole, required=True, help="the seed the question was shown with")
    p_grade.add_argument("--answer", type=_number, required=True, help="the answer, in the unit asked for")
    p_grade.add_argument("--json", action="store_true", help="print one JSON object")
    p_grade.set_defaults(func=cmd_grade)
    p_export = inner.add_parser("export", help="a class set as an nbgrader course's source notebook")
    p_export.add_argument("course", type=Path, help="the nbgrader course directory (created if missing)")
    p_export.add_argument("--seed", type=_whole, required=True, help="the class set's numbers")
    p_export.add_argument("--chapter", type=_chapter, action="append", help="a chapter to include (repeat it; "
                          "default: every chapter)")
    p_export.set_defaults(func=cmd_export)
