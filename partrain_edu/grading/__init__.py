"""Autograded exercise checks: `check(name, *your_functions)` grades a learner's answer against a reference.

    from partrain_edu.grading import check
    check("ring_all_reduce", ring_all_reduce)     # on 4 ranks and their sub-groups, fresh inputs per run

A check grades values *and* the resource the lesson is about (bytes sent, bytes held, bubble, activations), on
configurations drawn afresh for every run (trials.py), so no answer fitted to one setup passes.
It prints one line on a pass and raises AssertionError on a failure (so nbval and pytest see it) with which
rank, what differed (expected vs got, shapes) and a hint. Multi-rank checks run the learner's function source
on N ranks through `launcher.oneshot.torchrun` with a timeout (a deadlock ends in a message, never a hang);
the ranks only report what came out, and the caller judges it against values it computes itself.
Where: exercise NN_<name>'s check is checks/<name>.py (07's: placement_3d; a large one also has a helper module,
or is a package: 08's, 09's), registered in registry.py, run by runner.py (on ranks: on_ranks.py, rank_main.py).
`partrain-edu check PATH` grades whole notebooks headlessly, untrusted ones in a sandbox (headless/); exercises/
and the grader's manifest come from solutions/ (authoring/).
"""
from partrain_edu.grading.registry import CHECKS, CheckResult
from partrain_edu.grading.runner import check, check_names, run_check

__all__ = ["CHECKS", "CheckResult", "check", "check_names", "run_check"]
