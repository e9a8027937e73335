"""The problem sets: at least 60 problems over at least 12 chapters; a seed gives the same numbers and another
seed new ones; the key is accepted and the values of known slips are refused with their hint, which never
states the key; the command line (list, show, grade) and a notebook's sheet. Each chapter's keys are recomputed
independently in tests/test_problems_chNN.py; this file checks that every problem has such a computation."""
import importlib.util
import json
import math
import re
from pathlib import Path

import pytest

from partrain_edu.cli import main
from partrain_edu.problems.bank import PROBLEMS, chapters, draw, grade
from partrain_edu.problems.core import KINDS, Drawn, Problem, hint, told_apart
from partrain_edu.problems.sheet import problem_set

SEEDS = [1, 2, 3, 17, 2026]
HERE = Path(__file__).parent


def _json(capsys, argv) -> tuple[int, dict]:
    code = main(argv)
    return code, json.loads(capsys.readouterr().out)


def test_list_json_has_at_least_60_problems_over_12_chapters(capsys):
    code, listed = _json(capsys, ["problems", "list", "--json"])
    assert code == 0 and listed["count"] == len(listed["problems"]) == len(PROBLEMS) >= 60
    assert len(listed["chapters"]) >= 12 and set(listed["chapters"]) >= {f"{c:02d}" for c in (*range(1, 9),
                                                                                                *range(10, 16))}
    assert {row["kind"] for row in listed["problems"]} == set(KINDS)


def test_every_problem_has_an_independent_key_in_its_chapter_test():
    independent = set()
    for path in sorted(HERE.glob("test_problems_ch*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        independent |= set(module.INDEPENDENT)
    assert sorted(independent) == sorted(PROBLEMS)


def test_show_gives_the_same_numbers_for_a_seed_and_new_ones_for_another(capsys):
    def shown(seed):
        rows = [row for chapter in chapters()
                for row in _json(capsys, ["problems", "show", chapter, "--seed", seed, "--json"])[1]["problems"]]
        return {row["id"]: row["question"] for row in rows}
    one, again, two = shown("1"), shown("1"), shown("2")
    assert one == again and len(one) == len(PROBLEMS)
    assert all(one[pid] != two[pid] for pid in one), [pid for pid in one if one[pid] == two[pid]]


@pytest.mark.parametrize("pid", sorted(PROBLEMS))
def test_the_key_passes_and_each_slip_is_named_without_the_key(pid):
    p = PROBLEMS[pid]
    for seed in SEEDS:
        drawn = draw(pid, seed)
        assert math.isfinite(drawn.answer) and drawn.answer != 0
        assert grade(pid, seed, drawn.answer)["correct"]
        assert grade(pid, seed, drawn.answer * (1 + 0.9 * p.rtol))["correct"]
        assert not grade(pid, seed, drawn.answer * (1 + 3 * p.rtol))["correct"]
        for value, why in drawn.mistakes:
            result = grade(pid, seed, value)
            if math.isclose(value, drawn.answer, rel_tol=p.rtol):
                continue   # this draw makes the slip harmless: nothing to tell apart
            assert not result["correct"] and why in result["hint"], (seed, value, why, result["hint"])
            for shown in {f"{drawn.answer:g}", f"{drawn.answer:.3g}", f"{drawn.answer:.2f}"} - {"0.00"}:
                if len(shown.strip("-0.").replace(".", "")) < 3:
                    continue   # a key of one or two digits, such as 2, is in any formula's text
                assert not re.search(rf"(?<![\d.]){re.escape(shown)}(?![\d])", result["hint"]), (shown, result)


def test_grade_json_answers_correct_and_hint_and_exits_0_or_1(capsys):
    key = draw("01.ring-all-reduce", 5).answer
    code, right = _json(capsys, ["problems", "grade", "01.ring-all-reduce", "--seed", "5", "--answer", str(key),
                                 "--json"])
    assert code == 0 and right["correct"] and right["hint"] is None and "2(n−1)/n" in right["formula"]
    code, wrong = _json(capsys, ["problems", "grade", "01.ring-all-reduce", "--seed", "5", "--answer",
                                 str(key * 8), "--json"])
    assert code == 1 and not wrong["correct"] and "bits for bytes (a 400 Gb/s link moves 50 GB/s)" in wrong["hint"]


@pytest.mark.parametrize("argv, words", [
    (["problems", "show", "01.ring-al", "--seed", "1"], "did you mean 01.ring-all-reduce"),
    (["problems", "grade", "01.ring-all-reduce", "--seed", "1.5", "--answer", "3"], "not a whole number"),
    (["problems", "grade", "01.ring-all-reduce", "--seed", "1", "--answer", "12 MB"], "is not a number"),
    (["problems", "list", "--chapter", "09"], "no problems for chapter"),
    (["problems", "grade", "01.ring-all-reduce", "--seed", "1", "--answer", "nan"], "must be a number"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    try:
        code = main(argv)
    except SystemExit as exit_:   # argparse's own errors exit from inside main
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_sheet_prints_the_chapters_questions_and_grades_answers(capsys):
    sheet = problem_set("01", seed=4)
    printed = capsys.readouterr().out
    assert all(draw(p.id, 4).question.split()[0] in printed for p in sheet.problems)
    key = draw(sheet.problems[0].id, 4).answer
    sheet.check({1: key, 2: None, 3: key * 1e3})
    out = capsys.readouterr().out
    assert "1. " in out and "✓" in out and "replace None" in out and "✗" in out
    assert f"{key:g}" not in out.split("✓")[1]   # the key never printed by a wrong answer's line
    with pytest.raises(ValueError, match="answer problems 1 to"):
        sheet.check({99: 1.0})


def test_a_slip_the_draw_made_harmless_is_never_named():
    """A slip within the tolerance of the key (the latency term of a big message, (n−1)/n for large n) would be
    graded right: an answer just outside the tolerance must not be blamed on it."""
    p = Problem("99.sample", "a sample", "MB", "one step", "S", "nowhere", make=lambda rng: None)
    drawn = Drawn("q", 100.0, mistakes=[(100.5, "a harmless slip"), (50.0, "half of it")])
    assert "harmless" not in hint(p, drawn, 101.3) and hint(p, drawn, 50.2) == "Likely: half of it."
    assert told_apart(100.0, drawn.mistakes) == [(50.0, "half of it")]
