"""The sandbox shows no reference implementation (issue 30, M1): a submission that reaches for the course's
own answer — a computed `__import__`, importlib, sys.modules, reading the package's source and exec'ing it,
exec of a built string, on the kernel or on the ranks, or a check's own reference — scores 0 with a reason.
That every honest notebook still scores 1 in the same sandbox is test_exercises' (all 13 solutions).
The view itself (view.py) keeps the exercises' helpers and drops every answer."""
import copy
import json
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

from partrain_edu.grading.headless import view

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
jailed = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="the sandbox needs root")

TOP = "import builtins, importlib, os, sys\nfrom partrain_edu.grading import check\n"   # allowed imports
REACH = {  # how each body gets at the course's module; none of these spellings is a literal the AST check reads
    "computed_import": "getattr(builtins, '__imp' + 'ort__')('partrain_' + 'edu.theory.memory', fromlist=['x'])",
    "importlib": "getattr(importlib, 'import_' + 'mod' + 'ule')('partrain_' + 'edu.theory.memory')",
    "sys_modules": "(next((m for m in list(sys.modules.values()) if getattr(m, '__name__', '') != '__main__' and "
                   "hasattr(m, 'model_state_bytes')), None) or sys.modules['partrain_' + 'edu.theory'])",
    "read_source": "_run(open(os.path.join(os.path.dirname(sys.modules['partrain_' + 'edu'].__file__), 'theory', "
                   "'memory.py')).read())",
    "exec": "_run('from partrain_' + 'edu.theory.memory import model_state_bytes')",
}
RUN = ("def _run(text):\n    ns = {}\n    getattr(builtins, 'ex' + 'ec')(text, ns)\n"
       "    return type('M', (), {'model_state_bytes': staticmethod(ns['model_state_bytes'])})\n")
BODY = "def model_state_bytes(params, dp, zero):\n    return sum({reach}.model_state_bytes(params, dp=dp, zero=zero))\n"
RING = ("def ring_all_reduce(tensor, group=None):\n    m = getattr(__import_alias__, '__imp' + 'ort__')('partrain_' + "
        "'edu.parallel.ring', fromlist=['x'])\n    return m.ring_all_reduce(tensor, group)\n").replace(
            "__import_alias__", "__builtins__ if not isinstance(__builtins__, dict) else type('B', (), __builtins__)")

BOUND = ("def max_dp_degree(params, tokens_per_step, peak_flops, bandwidth):\n    m = getattr(builtins, '__imp' + "
         "'ort__')('partrain_' + 'edu.grading.checks.communication_bounds', fromlist=['x'])\n"
         "    return m.largest_degree(m.dp_slack(params, tokens_per_step, peak_flops, bandwidth))\n")

PYC = ("def max_dp_degree(params, tokens_per_step, peak_flops, bandwidth):\n    import glob, marshal\n"
       "    here = os.path.dirname(sys.modules['partrain_' + 'edu.grading'].__file__)\n"
       "    cache = glob.glob(os.path.join(here, 'checks', '__pycache__', 'communication_bounds*'))\n"
       "    code = open(cache[0], 'rb').read()\n"
       "    ns = {'__name__': 'x'}\n    getattr(builtins, 'ex' + 'ec')(marshal.loads(code[16:]), ns)\n"
       "    return ns['largest_degree'](ns['dp_slack'](params, tokens_per_step, peak_flops, bandwidth))\n")


def with_body(exercise: str, function: str, text: str):
    nb = nbformat.read(os.path.join(ROOT, "solutions", f"{exercise}.ipynb"), as_version=4)
    nb = copy.deepcopy(nb)
    cell = next(c for c in nb.cells if c.cell_type == "code" and f"def {function}" in c.source)
    rest = cell.source[cell.source.index(f"def {function}"):]
    after = rest[rest.find("\ndef ", 1):] if "\ndef " in rest[1:] else ""
    cell.source = cell.source[:cell.source.index(f"def {function}")] + text + after
    return nb


def test_the_view_keeps_the_helpers_and_drops_the_answers(tmp_path):
    view.build(tmp_path)
    text = {m: tmp_path.joinpath(*m.split(".")).with_suffix(".py").read_text() for m in view.EXPOSED}
    for module, names in view.EXPOSED.items():
        assert all(f"def {n}" in text[module] or f"class {n}" in text[module] or f"{n} =" in text[module]
                   for n in names), module
    for module, answer in [("parallel.ring", "ring_all_reduce"), ("theory.memory", "model_state_bytes"),
                           ("theory.schedules", "build_schedule"), ("parallel.buckets", "GradBucketHooks")]:
        assert f"def {answer}" not in text[module] and f"class {answer}" not in text[module]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*view.HIDDEN, "emptied"])
    assert (tmp_path / "emptied" / "grading__checks__communication_bounds.py").read_text() == ""


def test_the_view_runs_on_its_own(tmp_path):
    view.build(tmp_path / "partrain_edu")
    code = ("import sys; sys.modules.pop('partrain_edu', None)\n"
            "from partrain_edu.theory.schedules import simulate, Action, Schedule\n"
            "from partrain_edu.theory.memory import gpt_param_count\nfrom partrain_edu.theory.hardware import DEVICES\n"
            "from partrain_edu.parallel.ring import chunk_bounds, ring_bytes_sent_by\n"
            "from partrain_edu.parallel.buckets import plan_buckets\n"
            "print(simulate(Schedule('x', 1, 1, 1, ((Action('F', 0), Action('B', 0)),))).makespan, "
            "chunk_bounds(7, 3), gpt_param_count(2, 8, vocab=16, seq=4) > 0, sorted(DEVICES))\n")
    (tmp_path / "partrain_edu" / "__init__.py").write_text("")
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "3.0"


@jailed
@pytest.mark.timeout(900)
def test_hostile_imports_score_0(tmp_path):
    folder = tmp_path / "submitted"
    folder.mkdir()
    for name, reach in REACH.items():
        source = TOP + (RUN if "_run" in reach else "") + BODY.format(reach=reach)
        nbformat.write(with_body("03_memory_zero_stage", "model_state_bytes", source),
                       folder / f"{name}-03_memory_zero_stage.ipynb")
    nbformat.write(with_body("01_ring_all_reduce", "ring_all_reduce", RING), folder / "ranks-01_ring_all_reduce.ipynb")
    nbformat.write(with_body("13_communication_bounds", "max_dp_degree", TOP + BOUND),
                   folder / "grader-13_communication_bounds.ipynb")   # the check's own reference: not there
    nbformat.write(with_body("13_communication_bounds", "max_dp_degree", TOP + PYC),
                   folder / "pyc-13_communication_bounds.ipynb")      # nor its bytecode
    done = subprocess.run([sys.executable, "-m", "partrain_edu", "check", str(folder), "--json", "--timeout", "300"],
                          capture_output=True, text=True, timeout=880)
    report = json.loads(done.stdout)
    assert "implementations" in report["isolation"], report["isolation"]
    scores = {os.path.basename(nb["path"]).split("-")[0]: nb for nb in report["notebooks"]}
    for key, error in [("grader", "AttributeError"), ("pyc", "IndexError")]:
        bound = {c["name"]: c for c in scores.pop(key)["checks"]}["max_dp_degree"]
        assert not bound["passed"] and f"raised {error}" in bound["message"], bound
    assert {k: nb["score"] for k, nb in scores.items()} == {k: 0.0 for k in [*REACH, "ranks"]}
    for key, nb in scores.items():
        assert "raised" in nb["checks"][0]["message"], (key, nb["checks"][0]["message"])
