"""An exercise is passed by writing the algorithm: for every check, a graded function that imports the course's
own implementation is refused before anything runs, with a message saying what is allowed — as its source (what
travels to the ranks and to the grader), as a live function reading a course object from another cell, and in
a submitted notebook graded by `partrain-edu check`."""
from pathlib import Path

import nbformat
import pytest

from partrain_edu.grading import check_names, run_check
from partrain_edu.grading.authoring.manifest import EXERCISES
from partrain_edu.grading.headless.grader import grade_notebook
from partrain_edu.grading.headless.sandbox import _unjailed
from partrain_edu.grading.learner_code import Source

ROOT = Path(__file__).resolve().parents[1]
# check -> what a learner would reach for instead of writing the answer
COURSE_IMPLEMENTATION = {
    "ring_all_reduce": "from partrain_edu.parallel.ring import ring_all_reduce",
    "ddp_buckets": "from partrain_edu.parallel.buckets import GradBucketHooks",
    "model_state_bytes": "from partrain_edu.theory.memory import model_state_bytes",
    "zero_stage": "from partrain_edu.theory.memory import model_state_bytes",
    "zero1_step": "from partrain_edu.parallel.zero import ZeroOptimizer",
    "tp_f_g": "from partrain_edu.parallel.tp_comm import all_reduce_",
    "tp_mlp": "from partrain_edu.parallel.tensor import ColumnParallelLinear, RowParallelLinear",
    "one_f_one_b": "from partrain_edu.theory.schedules import build_schedule",
    "groups_inside_node": "from partrain_edu.theory.grid import group_ranks",
    "build_groups": "from partrain_edu.topology import Topology",
    "zero3_unit": "from partrain_edu.parallel.fsdp_unit import Unit",
    "sharded_optimizer": "from partrain_edu.parallel.zero import ZeroOptimizer",
    "activation_checkpointing": "from partrain_edu.parallel.sequence import SavedBytes",
    "pipeline_executor": "from partrain_edu.parallel.pipeline import PipelineExecutor",
    "ring_attention": "from partrain_edu.grading.checks.ring_attention_reference import attention",
    "max_dp_degree": "from partrain_edu.theory.traffic import ring_bytes_sent",
    "max_fsdp_degree": "from partrain_edu.theory.traffic import ring_bytes_sent",
    "max_tp_degree": "from partrain_edu.theory.traffic import ring_bytes_sent",
    "min_dp_batch": "from partrain_edu.grading.checks.communication_bounds import min_batch",
}
REFUSED = "an exercise is passed by writing the algorithm with torch and torch.distributed"


def test_every_check_has_the_implementation_a_learner_would_import():
    assert set(COURSE_IMPLEMENTATION) == set(check_names())


@pytest.mark.parametrize("name", sorted(COURSE_IMPLEMENTATION))
def test_a_function_importing_the_course_is_refused_before_it_runs(name):
    functions = next(f for checks in EXERCISES.values() for check, f in checks if check == name)
    body = f"    {COURSE_IMPLEMENTATION[name]}\n    return None\n"
    sources = [Source(f, f"def {f}(*args, **kwargs):\n{body}") for f in functions]
    result = run_check(name, *sources)
    assert not result.passed and REFUSED in result.message, result.message
    assert "line 2, uses partrain_edu." in result.message and result.message.count("\n") == 1


def test_a_live_function_reading_a_course_object_from_another_cell_is_refused():
    from partrain_edu.theory.memory import model_state_bytes as reference  # "another cell"

    def model_state_bytes(params, dp, zero):
        return sum(reference(params, dp=dp, zero=zero))

    result = run_check("model_state_bytes", model_state_bytes)
    assert not result.passed and "uses reference (from partrain_edu.theory.memory)" in result.message
    result = run_check("model_state_bytes", reference)  # the course's function itself
    assert not result.passed and "is the course's own (partrain_edu.theory.memory" in result.message


def test_a_submitted_notebook_that_imports_the_implementation_fails_every_check(tmp_path):
    nb = nbformat.read(ROOT / "solutions" / "03_memory_zero_stage.ipynb", as_version=4)
    nb.cells.insert(1, nbformat.v4.new_code_cell("from partrain_edu.theory.memory import model_state_bytes as ref"))
    path = tmp_path / "03_memory_zero_stage.ipynb"
    nbformat.write(nb, path)
    report = grade_notebook(path, "03_memory_zero_stage", _unjailed("a test"), 60)
    assert report["score"] == 0.0 and len(report["checks"]) == 2
    assert all("cell 2, line 1, uses partrain_edu.theory.memory.model_state_bytes" in c["message"]
               for c in report["checks"]), report
