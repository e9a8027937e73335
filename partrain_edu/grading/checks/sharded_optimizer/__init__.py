"""Check `sharded_optimizer` (exercise 09): a ZeRO-1 sharded optimizer (零冗余优化器) that wraps any torch.optim
class on any model, like torch.distributed.optim.ZeroRedundancyOptimizer (Rajbhandari et al. 2020, §5.1, P_os).

On 2 ranks, 3 runs × 3 steps — AdamW and SGD-momentum over two param groups, SGD over model.parameters() — of a
small model (2-D, 1-D and 0-D parameters, one frozen, a buffer). The ranks average the gradients themselves
(all-reduce outside the traced window) before each `step()`. Graded, from values recomputed here single-process:
1. every parameter after each step equals plain torch.optim on the averaged gradients; frozen one and buffer kept;
2. optimizer state, weighed by walking `opt.optim.state` (the documented inner optimizer): each trainable
   parameter is stepped by exactly one rank, the frozen one by none; a rank holds exactly the single-process
   state of the parameters it owns, at most S/n + (1 − 1/n)·s_max bytes (S: the whole state, s_max: the
   largest parameter's; Graham's bound for greedy least-loaded assignment);
3. traffic per step: broadcast / all-gather only (no all-reduce), carrying B = Σ bytes(p) over the trainable
   parameters once, rank r receiving B − B_r (B_r: the bytes of the parameters it owns).
"""
from __future__ import annotations

from partrain_edu.grading.checks.sharded_optimizer.observe import TRAINABLE_BYTES, observe
from partrain_edu.grading.checks.sharded_optimizer.verify import ADAMW_BOUND, ADAMW_STATE, verify
from partrain_edu.grading.registry import register

register("sharded_optimizer", nproc=2, observe=observe,
         summary="3 steps each of AdamW and SGD-momentum (two param groups, a "
         "frozen parameter) equal single-process torch.optim; each rank holds only its own parameters' optimizer "
         f"state (AdamW: ≤ {ADAMW_BOUND:.0f} B of S = {ADAMW_STATE} B on 2 ranks; the frozen one none); a step "
         f"sends each trainable parameter once from its owner, B = {TRAINABLE_BYTES} B, rank r receiving B − B_r",
         deadlock_hint="Likely: the ranks disagree on who owns which parameter, or walk the parameters in "
         "different orders — compute the assignment the same way on every rank (from sizes and positions, "
         "never from anything rank-local) and broadcast every trainable parameter, in the same order.")(verify)
