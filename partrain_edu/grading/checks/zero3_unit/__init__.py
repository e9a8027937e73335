"""Check `zero3_unit` (exercise 08), ZeRO-3 / FSDP units (Rajbhandari et al. 2020 §5.3; Zhao et al. 2023 §3):
`fsdp_step(root, units, x, y, lr, group)` trains a model whose parameters no rank of the group holds whole. Units
Linear(d, d) + Tanh, then the root's head Linear(d, c): each is one flat tensor (weight, bias, zero padding to a
multiple of n), and each of the group's n ranks holds only its 1/n shard of every one. The root is sharded too
but, as in PyTorch FSDP, not resharded after forward (backward starts with it): gathered once a step, kept until
its own gradient is reduce-scattered.

Each grading run draws two training runs (observe.runs): one on the default group of all 4 ranks and one on a
split of the 4 into groups, one of ≥ 2 not starting at rank 0 ([0, 2] and [1, 3], or [0] and [1, 2, 3] …), every
group training its own model at once; each with its own d, c, number of units, rows per batch, 2–3 steps and lr.
Graded per step, each rank on its own batch: (1) the loss, every shard after the update, dL/dx of this rank's loss
(x requires grad; x.grad as loss.backward() leaves it) and the untouched x and y equal one process training the
whole model on the union of the group's batches (verify.py, recomputed from the seed); (2) traffic (CommTracer):
all-gathers and reduce-scatters only, all on the group, each unit gathered for forward and again for backward and
its gradient reduce-scattered: 3·(n−1)/n·S_units, 1.5× DDP's 2(n−1)/n·S_units, plus 2·(n−1)/n·S_root; (3) memory:
the gathered full parameters alive at once (the given `gather`'s results, followed with weakref.finalize: a view,
or a tensor autograd saved, keeps one alive) never exceed root + one unit, and none is left alive after the step.
A copy (.clone()) of gathered parameters escapes that count.
"""
from __future__ import annotations

from partrain_edu.grading.checks.zero3_unit.observe import observe, tracked_gather
from partrain_edu.grading.checks.zero3_unit.verify import verify
from partrain_edu.grading.givens.zero3_unit import views
from partrain_edu.grading.registry import register

SUMMARY = ("on drawn widths, numbers of units, batches, learning rates and steps, on all 4 ranks and on sub-groups "
           "of them, every step equals one process on the group's batches (loss, shards, dL/dx); each unit is "
           "all-gathered before forward and again before backward and its gradient reduce-scattered, 3(n−1)/n·S a "
           "step, 1.5× DDP's 2(n−1)/n·S; at most root + one unit of full parameters alive at once")

register("zero3_unit", nproc=4, observe=observe, given={"gather": tracked_gather, "views": views}, summary=SUMMARY,
         deadlock_hint="Likely: the ranks make different collectives or in another order — every rank gathers "
         "and reduce-scatters the same units in the same order (autograd runs backward in reverse on each), "
         "all on `group`.",
         mismatch_hint="Pass `group` to gather and to every collective: the ranks outside your group hold shards "
         "of other sizes.")(verify)
