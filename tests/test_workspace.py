"""The learner's workspace: `make lab` runs the course in a git-ignored copy, so the clone's notebooks stay as
committed, and bringing in the course's updates never loses a learner's change."""
import hashlib
import subprocess
import sys

import pytest

from conftest import REPO
from partrain_edu.workspace import MANIFEST, sync


def _course(root):
    for rel, text in {"notebooks/00_a.ipynb": "a1", "notebooks/01_b.ipynb": "b1", "exercises/01_e.ipynb": "e1",
                      "benchmarks/bench.py": "print(1)"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_sync_brings_updates_and_refresh_takes_them_keeping_the_learners_version(tmp_path):
    course, workspace = _course(tmp_path / "course"), tmp_path / "course" / "workspace"
    report = sync(course, workspace)
    assert report.created and sorted(report.added) == ["exercises/01_e.ipynb", "notebooks/00_a.ipynb",
                                                      "notebooks/01_b.ipynb"]
    assert (workspace / "benchmarks" / "bench.py").read_text() == "print(1)"  # `../benchmarks/...` still works
    assert (workspace / "benchmarks").resolve() == (course / "benchmarks").resolve()

    (workspace / "notebooks" / "00_a.ipynb").write_text("a1 with my answers")  # the learner works on one
    (workspace / "notebooks" / "mine.ipynb").write_text("my scratch")          # and makes one of their own
    for name, text in (("00_a", "a2"), ("01_b", "b2")):                         # `git pull` changes both
        (course / "notebooks" / f"{name}.ipynb").write_text(text)
    (course / "notebooks" / "02_c.ipynb").write_text("c1")                      # and adds a chapter

    report = sync(course, workspace)  # what every `make lab` does
    assert report.added == ["notebooks/02_c.ipynb"] and report.updated == ["notebooks/01_b.ipynb"]
    assert report.kept == ["notebooks/00_a.ipynb"] and "make refresh" in report.lines(workspace)[-1]
    assert (workspace / "notebooks" / "00_a.ipynb").read_text() == "a1 with my answers"
    assert (workspace / "notebooks" / "01_b.ipynb").read_text() == "b2"
    assert sync(course, workspace).kept == ["notebooks/00_a.ipynb"]  # said again until it is resolved

    report = sync(course, workspace, take_newer=True)  # `make refresh`
    assert (workspace / "notebooks" / "00_a.ipynb").read_text() == "a2"
    [backup] = report.backed_up
    assert backup.startswith("backups/") and backup.endswith("/notebooks/00_a.ipynb")
    assert (workspace / backup).read_text() == "a1 with my answers"
    assert (workspace / "notebooks" / "mine.ipynb").read_text() == "my scratch"
    assert sync(course, workspace).lines(workspace) == []  # up to date: nothing to say
    assert (workspace / MANIFEST).is_file()


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(300)
def test_running_a_notebook_in_the_workspace_leaves_the_clone_as_committed(tmp_path):
    workspace = tmp_path / "workspace"
    made = subprocess.run([sys.executable, "-m", "partrain_edu.workspace", "--course", str(REPO),
                           "--workspace", str(workspace), "sync"], capture_output=True, text=True, timeout=60)
    assert made.returncode == 0 and made.stdout.startswith(f"created {workspace}"), made.stderr
    name = "03_memory_wall.ipynb"  # a short chapter that trains in process: about 10 s
    course_copy = REPO / "notebooks" / name
    before = _digest(course_copy), _git_status()
    ran = subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "--inplace",
                          "--ExecutePreprocessor.timeout=240", name], cwd=workspace / "notebooks",
                         capture_output=True, text=True, timeout=280)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert _digest(workspace / "notebooks" / name) != before[0]  # it ran: the learner's copy has new outputs
    assert (_digest(course_copy), _git_status()) == before  # ...and nothing in the clone changed


def _git_status() -> str:
    """What git sees changed under the course's folders (other edits in progress elsewhere in the clone are not
    this test's business)."""
    return subprocess.run(["git", "status", "--porcelain", "--", "notebooks", "exercises", "solutions"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout
