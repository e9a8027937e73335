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
NOTEBOOK_PLACE = re.compile(r"^\[(?P<name>[\w.-]+\.ipynb)\]\(\.\./notebooks/(?P=name)\) › (?P<heading>#{1,3} .+)$")
OTHER_PLACE = re.compile(r"^(module|command) `[^`]+`$")
MAX_NOT_SHOWN = 5


def claim_rows():
    return [ROW.match(line).groups() for line in NOTES.read_text().splitlines() if ROW.match(line)]


def markdown_headings(path: Path) -> set[str]:
    """Every `#`/`##`/`###` heading line of the notebook's markdown cells (lines inside ``` fences excluded)."""
    found = set()
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        fenced = False
        for line in "".join(cell["source"]).splitlines():
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced and re.match(r"#{1,3} ", line):
                found.add(line.rstrip())
    return found


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


def test_every_cited_module_exists():
    text = NOTES.read_text() + CLI_DOC.read_text()
    paths = set(re.findall(r"`((?:partrain_edu|benchmarks|tests|notebooks|exercises|solutions)/[\w./-]*)`", text))
    assert paths, "the pages cite no module at all: the pattern is out of date"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"cited but not in the repository: {missing}"


def test_the_disagreements_have_verdicts():
    numbers = {int(n) for _, _, _, verdict in claim_rows() for n in re.findall(r"#(\d+)", verdict)}
    assert numbers == set(range(1, 14)), f"disagreements with a verdict: {sorted(numbers)}"


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
