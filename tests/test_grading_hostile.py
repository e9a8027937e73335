"""Grading untrusted notebooks (`partrain-edu check FOLDER --csv`): a folder of hostile submissions built from
exercise 3 — check-deleting, log-forging, `run_check`-patching, package-editing, neighbour-deleting, an endless
loop, `os._exit`, five kinds of corrupt file — is graded row by row, only the solved notebook scores 1, the
package and the other submissions are untouched, every notebook ends within its limit and nothing is left
running. A ring all-reduce whose body forges the ranks' report (a clean verdict, clean-looking or huge
observations, then os._exit) fails: the grader verifies observations against values it computes itself, and
malformed ones (ill-typed, strings for numbers, nested, huge) fail in one line. Also: the CLI refuses a bad
--timeout or --csv before grading, and the unsandboxed fallback says so."""
import copy
import csv
import hashlib
import json
import math
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest

from conftest import processes_with
from partrain_edu.cli import main
from partrain_edu.grading.checks.ring_all_reduce import RANKS, inputs, rounds
from partrain_edu.grading.headless.cli import seconds
from partrain_edu.grading.headless.grader import grade_notebook
from partrain_edu.grading.headless.sandbox import PACKAGE, USER, _unjailed, isolation_for
from partrain_edu.grading.headless.submissions import NotANotebook, code_cells, exercise_of
from partrain_edu.grading.observations import verify
from partrain_edu.grading.runner import spec_of
from partrain_edu.parallel.ring import ring_bytes_sent_by

ROOT = Path(__file__).resolve().parents[1]
EXERCISE = "03_memory_zero_stage"
LIMIT_S = 30
RANKS_LIMIT_S = 180  # a notebook whose check starts 4 ranks: over 30 s with another `make test` beside it
SITE_PTH = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / \
    "site-packages" / "zz_tampered_by_submission.pth"

FORGE_LOG = """import json, os
fake = [{"name": n, "passed": True, "message": f"✓ {n} passed"} for n in ("model_state_bytes", "zero_stage")]
if os.environ.get("PARTRAIN_GRADING_LOG"):  # the old grader's log
    with open(os.environ["PARTRAIN_GRADING_LOG"], "a") as f:
        f.writelines(json.dumps(r) + "\\n" for r in fake)
lines = fake + [{"ran": 0, "errors": []}, {"problems": []}] + [{"id": i, "value": 0} for i in range(1, 50)]
payload = "".join(json.dumps(r) + "\\n" for r in lines).encode()
for fd in range(3, 256):  # every channel this process might hold, the grader's included
    try:
        os.write(fd, payload)
    except OSError:
        pass
"""
# Written to get past the import check (imports.py stops the honest shortcut, not this): the grader's own
# verdicts are what must hold.
PATCH_GRADER = """import sys
grading, registry, runner = (sys.modules["partrain_edu" + name] for name in (".grading", ".grading.registry",
                                                                            ".grading.runner"))
memory = sys.modules.get("partrain_edu" + ".grading.checks.memory_zero_stage") or grading
forged = lambda name, *objects, **kw: registry.CheckResult(name, True, f"✓ {name} passed")
runner.run_check = grading.run_check = forged
runner.graded = lambda spec, run: registry.CheckResult(spec.name, True, f"✓ {spec.name} passed")
for name, spec in list(registry.CHECKS.items()):
    registry.CHECKS[name] = type(spec)(name, spec.nproc, spec.arity, lambda *a: [], spec.summary)
memory.reference_total = lambda *args: 0
"""
LEFTOVER = f"partrain-hostile-leftover-{os.getpid()}"  # this run's: another make test may run beside it
LOOP_FOREVER = f"""import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{LEFTOVER}"])  # must die with the kernel
while True:
    pass
"""
EDIT_PACKAGE = f"""import os, sys
package = os.path.dirname(sys.modules["partrain_edu"].__file__)
for path, text in [(os.path.join(package, "grading", "runner.py"), "\\nrun_check = lambda *a, **k: None\\n"),
                   (os.path.join(package, "tampered_by_submission.py"), "x = 1\\n"),
                   ({str(SITE_PTH)!r}, "import os\\n")]:
    try:
        with open(path, "a") as f:
            f.write(text)
    except OSError as err:
        print(path, err)
"""


def delete_neighbours(folder: Path) -> str:
    return f"""import glob, os
for path in glob.glob("*.ipynb") + glob.glob({str(folder)!r} + "/*.ipynb") + glob.glob("/tmp/**/*.ipynb"):
    try:
        os.remove(path)
    except OSError as err:
        print(path, err)
"""


def _cells(nb, *, drop=(), add=(), replace=None):
    nb = copy.deepcopy(nb)
    nb.cells = [c for c in nb.cells if not any(d in c.source for d in drop)]
    for cell in nb.cells:
        if replace and replace[0] in cell.source:
            cell.source = replace[1]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in add]
    return nbformat.writes(nb)


def build_folder(folder: Path) -> dict[str, str]:
    """name → what the notebook does; written into `folder` (names sort so the vandals come first)."""
    blank = nbformat.read(ROOT / "exercises" / f"{EXERCISE}.ipynb", as_version=4)
    solved = nbformat.read(ROOT / "solutions" / f"{EXERCISE}.ipynb", as_version=4)
    answer = next(c.source for c in solved.cells if "def model_state_bytes" in c.source)
    half = answer.split("def smallest_zero_stage")[0] + \
        "def smallest_zero_stage(params, dp, device_bytes):\n    raise NotImplementedError('later')\n"
    texts = {
        "a-package-editing": _cells(blank, add=[EDIT_PACKAGE]),
        "b-neighbour-deleting": _cells(blank, add=[delete_neighbours(folder)]),
        "blank": _cells(blank),
        "check-deleting": _cells(solved, drop=['check("zero_stage"'], replace=("def model_state_bytes", half)),
        "endless-loop": _cells(solved, add=[LOOP_FOREVER]),
        "log-forging": _cells(blank, drop=["check("], add=[FORGE_LOG]),
        "os-exit": _cells(solved, add=["import os\nos._exit(1)"]),
        "run-check-patching": _cells(blank, add=[PATCH_GRADER]),
        "solved": _cells(solved),
        "corrupt-empty": "",
        "corrupt-list": "[]",
        "corrupt-no-cells": '{"a": 1}',
        "corrupt-cells-oops": '{"cells": "oops", "nbformat": 4}',
        "corrupt-truncated": _cells(blank)[:200],
    }
    for name, text in texts.items():
        (folder / f"{EXERCISE}-{name}.ipynb").write_text(text)
    return texts


def tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def sandbox_files(root: Path) -> list[Path]:
    """Files and folders under `root` that the sandbox user created."""
    uid = pwd.getpwnam(USER).pw_uid
    return [p for p in root.rglob("*") if p.lstat().st_uid == uid]


def sandbox_processes(homes: Path) -> list[int]:
    """PIDs (in this namespace) owned by the sandbox user and started by this test's grader (the sandbox's HOME
    is under `homes`, the grader's TMPDIR): after grading there must be none. Other tests, or another
    checkout's make test, may be grading beside this one as the same user."""
    uid = pwd.getpwnam(USER).pw_uid
    ours = f"HOME={homes}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                owner = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("Uid:"))
                environ = (entry / "environ").read_bytes().split(b"\0")
            except (OSError, StopIteration):
                continue
            if int(owner.split()[1]) == uid and any(var.startswith(ours) for var in environ):
                found.append(int(entry.name))
    return found


@pytest.fixture
def folder(tmp_path_factory):
    # Under /tmp, readable by others, like a shared classroom folder (pytest's own tmp_path is root-only).
    folder = tmp_path_factory.mktemp("submissions")
    folder.chmod(0o755)
    return folder


def test_hostile_folder_is_graded_row_by_row_in_the_sandbox(folder, tmp_path):
    build_folder(folder)
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("the sandbox needs root and util-linux's unshare")
    isolation = isolation_for(folder, next(folder.iterdir()))
    assert isolation.jailed, isolation.summary  # where a sandbox is possible, it must work
    neighbours = {p.name: p.read_bytes() for p in folder.iterdir()}
    # The grader's own files are hashed; the rest of the package only for files the sandbox user created
    # (other people may be editing the rest of a checkout while this runs).
    runner_py = PACKAGE / "grading" / "runner.py"
    grader_before, runner_before = tree_hash(PACKAGE / "grading"), runner_py.read_bytes()
    table = tmp_path / "grades.csv"
    homes = Path(tempfile.mkdtemp(prefix="partrain_hostile_"))  # the sandbox homes of this run only
    homes.chmod(0o711)
    try:
        run = subprocess.run([sys.executable, "-m", "partrain_edu", "check", str(folder), "--json", "--csv",
                              str(table), "--timeout", str(LIMIT_S)], capture_output=True, text=True, timeout=900,
                             env={**os.environ, "TMPDIR": str(homes)})
        grader_after, planted = tree_hash(PACKAGE / "grading"), sandbox_files(PACKAGE)
        planted += [p for p in (PACKAGE / "tampered_by_submission.py", SITE_PTH) if p.exists()]
    finally:  # should the sandbox ever fail, leave the checkout as it was
        if runner_py.read_bytes() != runner_before:
            runner_py.write_bytes(runner_before)
        for path in (PACKAGE / "tampered_by_submission.py", SITE_PTH):
            path.unlink(missing_ok=True)
    still = sandbox_processes(homes)
    shutil.rmtree(homes, ignore_errors=True)
    assert run.returncode == 1, run.stderr[-3000:]
    assert "isolation: sandbox: each notebook ran as user partrain-grader" in run.stderr
    report = {Path(nb["path"]).stem.split("-", 1)[1]: nb for nb in json.loads(run.stdout)["notebooks"]}
    assert grader_after == grader_before and not planted
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == neighbours
    assert not still and not processes_with(LEFTOVER)

    with open(table) as f:
        rows = list(csv.DictReader(f))
    assert {Path(r["notebook"]).stem.split("-", 1)[1] for r in rows} == set(report) and len(report) == 14
    assert [r for r in rows if r["passed"] == "1" and "solved" not in r["notebook"]] == \
        [r for r in rows if "check-deleting" in r["notebook"] and r["check"] == "model_state_bytes"]
    scores = {name: nb["score"] for name, nb in report.items()}
    assert scores == {name: 1.0 if name == "solved" else 0.5 if name == "check-deleting" else 0.0 for name in report}
    assert all(nb["seconds"] <= LIMIT_S + 15 for nb in report.values()), {n: nb["seconds"] for n, nb in report.items()}

    def reasons(name):
        return " ".join(c["message"] for c in report[name]["checks"])
    assert [c["name"] for c in report["check-deleting"]["checks"]] == ["model_state_bytes", "zero_stage"]
    assert "not implemented yet" in reasons("check-deleting")
    assert "not implemented yet" in reasons("run-check-patching")
    # its forged replies answer the grader's first request (the functions' source, for the import check): a failure
    assert "could not read the source of 'model_state_bytes'" in reasons("log-forging")
    assert f"did not finish within its {LIMIT_S} s (cell 9 was still running" in reasons("endless-loop")
    assert "exited with code 1 during cell 9" in reasons("os-exit")
    assert "not JSON" in reasons("corrupt-empty") and "not JSON" in reasons("corrupt-truncated")
    for name in ("corrupt-list", "corrupt-no-cells", "corrupt-cells-oops"):
        assert "JSON without a list of cells" in reasons(name)


def test_unsandboxed_fallback_still_grades_and_says_so(tmp_path):
    build_folder(tmp_path)
    isolation = _unjailed("a test")
    assert "no sandbox (a test)" in isolation.summary and "could change anything" in isolation.summary
    solved = grade_notebook(tmp_path / f"{EXERCISE}-solved.ipynb", EXERCISE, isolation, LIMIT_S)
    patched = grade_notebook(tmp_path / f"{EXERCISE}-run-check-patching.ipynb", EXERCISE, isolation, LIMIT_S)
    looping = grade_notebook(tmp_path / f"{EXERCISE}-endless-loop.ipynb", EXERCISE, isolation, 10)
    assert (solved["score"], patched["score"], looping["score"]) == (1.0, 0.0, 0.0), (solved, patched)
    assert "cell 9 was still running" in looping["checks"][0]["message"]  # so its child had been started
    assert not processes_with(LEFTOVER)


def test_a_notebook_is_graded_as_the_exercise_its_name_says():
    assert exercise_of(Path("alice-03_memory_zero_stage.ipynb")) == "03_memory_zero_stage"
    assert exercise_of(Path("03_memory_zero_stage/alice.ipynb")) == "03_memory_zero_stage"
    assert exercise_of(Path("alice/homework.ipynb")) is None
    assert exercise_of(Path("01_ring_all_reduce-and-02_ddp_buckets.ipynb")) is None  # two: refuse to guess


@pytest.mark.parametrize("text, words", [
    ("", "not JSON"), ("[]", "JSON without a list of cells"), ('{"a": 1}', "JSON without a list of cells"),
    ('{"cells": "oops"}', "JSON without a list of cells"), ('{"cells": [], "nbformat": 3}', "nbformat 3"),
    ('{"cells": ["x"], "nbformat": 4}', "cell 1 is not a cell"),
    ('{"cells": [{"cell_type": "code", "source": 7}], "nbformat": 4}', "cell 1's source is not text"),
])
def test_a_file_that_is_not_a_notebook_gets_a_one_line_reason(tmp_path, text, words):
    path = tmp_path / "x.ipynb"
    path.write_text(text)
    with pytest.raises(NotANotebook, match=words) as caught:
        code_cells(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0", "soon"])
def test_check_refuses_a_timeout_that_is_not_a_positive_number_of_seconds(value, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["check", str(ROOT / "exercises"), "--timeout", value])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeout" in err
    assert seconds("2.5") == 3  # a fraction is accepted, rounded up to whole seconds


def test_check_refuses_a_csv_in_a_missing_folder_before_grading(capsys):
    assert main(["check", str(ROOT / "solutions"), "--csv", "/nonexistent_dir/grades.csv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the gradebook /nonexistent_dir/grades.csv" in err


# --- a multi-rank check's ranks report observations, never a verdict -------------------------------------------

RING = "01_ring_all_reduce"
FORGE_VERDICT = """def ring_all_reduce(tensor, group=None):
    import os, sys; runtime = sys.modules["partrain_edu" + ".runtime"]
    runtime.publish("grading", {0: [], 1: [], 2: []}); os._exit(0)
"""
# Clean-looking observations: the run's rounds (read from the job's seed), the right shapes, no collective, the
# ring's neighbours and byte counts; but the values are the sum of ranks 0 and 1 only, not the sum of the group
# that the grader computes itself.
FORGE_OBSERVATIONS = """def ring_all_reduce(tensor, group=None):
    import json, os, sys
    runtime, ring, check = (sys.modules["partrain_edu" + name] for name in
                            (".runtime", ".parallel.ring", ".grading.checks.ring_all_reduce"))
    seed = json.load(open(sys.argv[1]))["seed"]

    def seen(rnd, me):
        members, given = rnd.group_of(me), check.inputs(rnd)
        g, n = members.index(me), len(members)
        values = {"shape": [rnd.numel], "values": (given[0] + given[1]).tolist()}
        return {"out": values, "returned": values, "ops": {"isend": 4, "irecv": 4}, "bytes": {},
                "sent": ring.ring_bytes_sent_by(g, rnd.numel, 4, n),
                "peers": {"isend": [members[(g + 1) % n]], "irecv": [members[(g - 1) % n]]}}
    runtime.publish("observations", json.dumps([[seen(rnd, me) for rnd in check.rounds(seed)] for me in range(4)]))
    os._exit(0)
"""
FORGE_HUGE = """def ring_all_reduce(tensor, group=None):
    import json, os, sys
    runtime = sys.modules["partrain_edu" + ".runtime"]
    runtime.publish("observations", json.dumps([[{"out": {"shape": [12], "values": [0.5] * 10**6}}]] * 3))
    os._exit(0)
"""


@pytest.mark.parametrize("body, words", [
    (FORGE_VERDICT, "the ranks finished without reporting their observations"),
    (FORGE_OBSERVATIONS, "Element 0 holds the sum of rank(s) [0, 1] (rank(s) [2, 3] never added)"),
    (FORGE_HUGE, "the ranks published over 1 MiB of observations"),
], ids=["verdict", "observations", "huge"])
def test_a_function_body_that_forges_the_ranks_report_fails(tmp_path, body, words):
    solved = nbformat.read(ROOT / "solutions" / f"{RING}.ipynb", as_version=4)
    path = tmp_path / f"{RING}-forger.ipynb"
    path.write_text(_cells(solved, replace=("def ring_all_reduce", body)))
    report = grade_notebook(path, RING, isolation_for(tmp_path, path), RANKS_LIMIT_S)
    [verdict] = report["checks"]
    assert report["score"] == 0.0 and not verdict["passed"], report
    assert words in verdict["message"], verdict["message"]
    assert verdict["message"].count("\n") == 2, verdict["message"]  # "✗ … failed:", one reason, its seed


RING_SEED = 5  # a run whose first round all-reduces 12 elements on the default group


def _reference_ring() -> list:
    """What honest ranks observe in check ring_all_reduce on run RING_SEED: the group's sums, in place,
    point-to-point only, the ring's neighbours and bytes."""
    ranks = []
    for r in range(RANKS):
        calls = []
        for rnd in rounds(RING_SEED):
            members = rnd.group_of(r)
            g, n = members.index(r), len(members)
            total = {"shape": [rnd.numel], "values": sum(inputs(rnd)[q] for q in members).tolist()}
            calls.append({"out": total, "returned": total, "ops": {"isend": 4, "irecv": 4}, "bytes": {},
                          "sent": ring_bytes_sent_by(g, rnd.numel, 4, n),
                          "peers": {"isend": [members[(g + 1) % n]], "irecv": [members[(g - 1) % n]]} if n > 1 else {}})
        ranks.append(calls)
    return ranks


def _spoiled(path: tuple, value) -> str:
    ranks = _reference_ring()
    for rank in ranks:
        target = rank
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return json.dumps(ranks)


@pytest.mark.parametrize("text, words", [
    ({"not": "text"}, "published a dict, not JSON text"),
    ("{'python': 'repr'}", "not JSON"),
    (json.dumps([[0.5] * 300_000] * 3), "over 1 MiB"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),
    (json.dumps([[]] * 2), "not a list of 4 items"),
    (_spoiled((0, "out", "values"), [math.nan] * 12), "got nan"),
    (_spoiled((0, "out", "values"), [0.5] * 13), "does not hold 12 values"),
    (_spoiled((0, "out", "values"), "twelve"), "does not hold 12 values"),
    (_spoiled((0, "out", "values"), ["1.0"] * 12), "holds something that is not a number"),  # strings for numbers
    (_spoiled((0, "out", "shape"), [-12]), "has no valid shape"),
    (_spoiled((0, "out", "shape"), [2**20, 2**20]), "over 1048576 values"),
    (_spoiled((0, "out", "values"), [10**400] * 12), "out of range"),
    (_spoiled((0, "out"), {"type": "NoneType"}), "expected a tensor of shape (12,), got NoneType"),
    (_spoiled((0, "sent"), True), "not a whole number"),
    (_spoiled((0, "sent"), math.nan), "not a whole number"),
    (_spoiled((0, "ops"), ["isend"]), "not a table of at most 64 counts"),
    (_spoiled((0, "ops"), {"all_reduce": "1"}), "not a whole number"),
    (_spoiled((0,), None), "has no entry 'out'"),
])
def test_observations_of_the_wrong_kind_fail_in_one_line(text, words):
    spec = spec_of("ring_all_reduce", 1)
    assert verify(spec, json.dumps(_reference_ring()), RING_SEED) == []  # the only way to pass: the grader's values
    problems = verify(spec, text, RING_SEED)
    assert len(problems) == 1 and "\n" not in problems[0] and words in problems[0], problems
