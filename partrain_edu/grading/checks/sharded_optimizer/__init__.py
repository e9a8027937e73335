"""Check `sharded_optimizer` (exercise 09): a ZeRO-1 sharded optimizer (零冗余优化器) that wraps any torch.optim
class on any model, like torch.distributed.optim.ZeroRedundancyOptimizer (Rajbhandari et al. 2020, §5.1, P_os).

Each run draws three configurations from its seed (setups.py), on 3 ranks: a model of random widths (2-D, 1-D and
0-D parameters, one or two of them frozen, a buffer), an optimizer class among SGD (momentum, maybe Nesterov),
Adam, AdamW and RMSprop with drawn hyper-parameters, the parameters handed over as model.parameters() or in param
groups with their own options, and the group — the default group of 3 twice, the sub-group [1, 2] once. Each runs
3 steps; the check averages the gradients itself before each `step()`. Graded, from values recomputed here
single-process (verify.py):
1. every collective goes over the group (one over another group is noted, run over the group, and named);
2. every parameter after each step equals plain torch.optim on the averaged gradients; frozen ones and the buffer
   kept; zero_grad() clears every gradient;
3. optimizer state, weighed by walking `opt.optim.state` (the documented inner optimizer, of the class asked for):
   each trainable parameter is stepped by exactly one rank, frozen ones by none; a rank holds exactly the
   single-process state of the parameters it owns, at most S/n + (1 − 1/n)·s_max bytes (S: the whole state, s_max:
   the largest parameter's; Graham's bound for greedy least-loaded assignment);
4. traffic per step: broadcast / all-gather only (no all-reduce), carrying B = Σ bytes(p) over the trainable
   parameters once, rank r receiving B − B_r (B_r: the bytes of the parameters it owns).
"""
from __future__ import annotations

from partrain_edu.grading.checks.sharded_optimizer.observe import observe
from partrain_edu.grading.checks.sharded_optimizer.setups import NPROC
from partrain_edu.grading.checks.sharded_optimizer.verify import verify
from partrain_edu.grading.registry import register

register("sharded_optimizer", nproc=NPROC, observe=observe,
         summary="on drawn models, frozen parameters, optimizers (SGD-momentum, Adam, AdamW, RMSprop with drawn "
         "hyper-parameters), param groups and groups (the default group of 3 ranks and the sub-group [1, 2]), 3 steps "
         "each equal single-process torch.optim; each rank holds exactly the optimizer state of the parameters it "
         "owns, within S/n + (1 − 1/n)·s_max, none for frozen ones; a step sends each trainable parameter once from "
         "its owner by broadcast or all-gather over the group, rank r receiving B − B_r",
         deadlock_hint="Likely: the ranks disagree on who owns which parameter, or walk the parameters in "
         "different orders — compute the assignment the same way on every rank (from sizes and positions, "
         "never from anything rank-local) and broadcast every trainable parameter, in the same order.")(verify)
