"""The project's own documentation (`docs/`, README) stays true to the repository: the claims page of the source
notes cites notebook sections that exist, the command-line page covers every subcommand and flag, and nothing a
learner has cites a file only the authors have (issue 16)."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTES = ROOT / "docs" / "source_notes.md"
CLI_DOC = ROOT / "docs" / "cli.md"
README = ROOT / "README.md"
# The authors' design and style files are not in the repository; the names are built so that this file does not
# mention them itself.
PRIVATE = ("DESIGN" + ".md", "STYLE" + ".md")
LEARNER_DIRS = ("partrain_edu", "benchmarks", "tests", "notebooks", "exercises", "solutions")
ROW = re.compile(r"^\| ([AB]\d+) \| (.+?) \| (.+?) \| (.*?) \|$")
# A place: a notebook and the heading of the section that shows the claim, then " (prose)" where that section
# shows it in text only, then " — what it shows" where it shows only part of the claim. No heading holds " — ".
NOTEBOOK_PLACE = re.compile(r"^\[(?P<name>[\w.-]+\.ipynb)\]\(\.\./notebooks/(?P=name)\) › (?P<heading>#{1,3} .+?)"
                            r"(?P<prose> \(prose\))?(?: — (?P<part>[^—]*\w[^—]*))?$")
OTHER_PLACE = re.compile(r"^(module|command) `[^`]+`$")
MAX_NOT_SHOWN = 5


def claim_rows():
    return [ROW.match(line).groups() for line in NOTES.read_text().splitlines() if ROW.match(line)]


def notebook_sections(path: Path) -> dict[str, bool]:
    """Every `#`/`##`/`###` heading line of the notebook's markdown cells (lines inside ``` fences excluded), and
    whether its section holds a code cell. A `##` or `###` section runs to the next heading of its level or above;
    the title's (`#`) to the first heading after it: the notebook's introduction."""
    sections, open_ = {}, []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            for heading in open_:
                sections[heading] = True
            continue
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,3} ", line):
                heading, level = line.rstrip(), len(line) - len(line.lstrip("#"))
                open_ = [h for h in open_ if 1 < len(h) - len(h.lstrip("#")) < level] + [heading]
                sections.setdefault(heading, False)
    return sections


def markdown_headings(path: Path) -> set[str]:
    """Every `#`/`##`/`###` heading line of the notebook's markdown cells (lines inside ``` fences excluded)."""
    return set(notebook_sections(path))


def test_the_claims_page_lists_every_claim_once():
    ids = [row[0] for row in claim_rows()]
    assert len(ids) >= 80, f"{len(ids)} claim rows; the notes make at least 80 claims"
    assert len(ids) == len(set(ids)), "a claim id appears twice"


def test_at_most_five_claims_are_not_shown():
    not_shown = [cid for cid, _, where, _ in claim_rows() if where.strip() == "not shown"]
    assert len(not_shown) <= MAX_NOT_SHOWN, f"not shown: {not_shown}"


def test_every_cited_notebook_section_exists():
    headings, wrong = {}, []
    for cid, _, where, _ in claim_rows():
        if where.strip() == "not shown":
            continue
        for place in where.split("<br>"):
            place = place.strip()
            match = NOTEBOOK_PLACE.match(place)
            if match is None:
                if not OTHER_PLACE.match(place):
                    wrong.append(f"{cid}: cannot read the place {place!r}")
                continue
            path = ROOT / "notebooks" / match["name"]
            if not path.exists():
                wrong.append(f"{cid}: no notebook {path.name}")
                continue
            if path not in headings:
                headings[path] = markdown_headings(path)
            if match["heading"] not in headings[path]:
                wrong.append(f"{cid}: {path.name} has no heading {match['heading']!r}")
    assert not wrong, "\n".join(wrong)


def notebook_places():
    """(claim id, the place's match) for every notebook place of the claims page."""
    return [(cid, match) for cid, _, where, _ in claim_rows() for place in where.split("<br>")
            if (match := NOTEBOOK_PLACE.match(place.strip()))]


def test_a_section_without_code_is_marked_prose():
    sections, unmarked = {}, []
    for cid, match in notebook_places():
        path = ROOT / "notebooks" / match["name"]
        if path.exists() and path not in sections:
            sections[path] = notebook_sections(path)
        if sections.get(path, {}).get(match["heading"]) is False and not match["prose"]:
            unmarked.append(f"{cid}: {path.name} › {match['heading']}")
    assert not unmarked, ("these sections hold no code cell, so they show the claim in prose: mark them (prose): "
                          f"{unmarked}")


def test_the_intro_counts_the_claims_shown_by_prose_alone():
    rows = [(cid, [NOTEBOOK_PLACE.match(p.strip()) for p in where.split("<br>")]) for cid, _, where, _ in claim_rows()]
    prose_only = sorted(cid for cid, places in rows if places and all(m is not None and m["prose"] for m in places))
    stated = re.search(r"(\d+) claims are shown by prose alone", NOTES.read_text())
    assert stated, "the intro should say how many claims are shown by prose alone"
    assert int(stated[1]) == len(prose_only), f"the intro says {stated[1]}; by prose alone: {prose_only}"


def test_every_notebook_is_cited_by_a_cell():
    cited = {match["name"] for _, match in notebook_places() if not match["prose"]}
    uncited = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if p.name not in cited)
    assert not uncited, f"no claim cites a section of: {uncited}"


def test_every_cited_module_exists():
    text = NOTES.read_text() + CLI_DOC.read_text()
    paths = set(re.findall(r"`((?:partrain_edu|benchmarks|tests|notebooks|exercises|solutions)/[\w./-]*)`", text))
    assert paths, "the pages cite no module at all: the pattern is out of date"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"cited but not in the repository: {missing}"


def test_the_disagreements_have_verdicts():
    numbers = {int(n) for _, _, _, verdict in claim_rows() for n in re.findall(r"#(\d+)", verdict)}
    assert numbers == set(range(1, 15)), f"disagreements with a verdict: {sorted(numbers)}"


def test_the_tally_of_disagreements_agrees_with_the_list():
    text = NOTES.read_text()
    stated = re.search(r"filled in for the (\d+) places", text)
    summed = re.search(r"The (\d+) disagreements, numbered", text)
    listed = re.findall(r"^(\d+)\. \*\*", text.split("## Where the notes are wrong or imprecise")[1], re.M)
    numbers = {int(n) for _, _, _, verdict in claim_rows() for n in re.findall(r"#(\d+)", verdict)}
    assert stated and summed, "the intro and the list should each state the number of disagreements"
    assert int(stated[1]) == int(summed[1]) == len(numbers), (stated[1], summed[1], sorted(numbers))
    assert [int(n) for n in listed] == sorted(numbers), f"the numbered list: {listed}"


def test_the_claims_page_does_not_point_at_the_notes_themselves():
    assert "seeds" not in NOTES.read_text()


def test_nothing_the_learner_has_cites_the_authors_files():
    cited = []
    for folder in LEARNER_DIRS:
        for path in (ROOT / folder).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix in (".png", ".pyc"):
                continue
            data = path.read_bytes()
            cited += [f"{path.relative_to(ROOT)}: {name}" for name in PRIVATE if name.encode() in data]
    assert not cited, f"cite docs/ instead: {cited}"


def test_the_readme_has_no_stale_status_and_links_the_docs():
    readme = README.read_text()
    assert not [word for word in ("(planned)", "(coming)") if word in readme]
    for page in ("docs/source_notes.md", "docs/cli.md"):
        assert f"]({page})" in readme, f"the README should link {page}"
    assert "solutions/" in readme and "make exercises" in readme


@pytest.fixture(scope="module")
def subcommands():
    from partrain_edu.cli import build_parser

    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return action.choices


def test_the_cli_page_covers_every_subcommand_and_flag(subcommands):
    text = CLI_DOC.read_text()
    missing = []
    for name, sub in subcommands.items():
        if f"## `{name}`" not in text:
            missing.append(f"section for {name}")
        for action in sub._actions:
            missing += [f"{name} {flag}" for flag in action.option_strings
                        if flag.startswith("--") and flag != "--help" and f"`{flag}" not in text]
    assert not missing, f"docs/cli.md lacks: {missing}"
