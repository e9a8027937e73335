"""ZeRO-1 and ZeRO-2 from scratch (零冗余优化器): optimizer states (and gradients) sharded over data parallelism.

    opt = ZeroOptimizer(model.parameters(), torch.optim.AdamW, stage=1, lr=3e-3)   # any model, no DDP wrapper
    partrain-edu train --strategy zero1 --nproc 4 --steps 20 --json

Rajbhandari et al. 2020, "ZeRO", §5.1–5.2. Every rank keeps the whole model for forward and backward; the
trainable parameters of each dtype are laid in one flat buffer (`flat_shard.FlatShard`) and rank k updates only
its chunk of ⌈Ψ/n⌉ elements. Sharded, fp32 + Adam: stage 1 optimizer 8⌈Ψ/n⌉ (grads stay 4Ψ); stage 2 also
grads 4⌈Ψ/n⌉. Sent per step (§7.2.1): reduce-scatter of the gradients, all-gather of the updated chunks,
2(n−1)/n·Ψ·4 bytes — DDP's all-reduce, which IS a reduce-scatter then an all-gather. Stage 2 reduce-scatters at
the end of every backward unless in `no_sync()` (m per step with m micro-batches) and drops the full gradients.
The inner optimizer steps this rank's *pieces* of the parameters, so an elementwise update (SGD, Adam, AdamW, …)
is the single-process one, parameter by parameter (param groups, a `step` each, none without a gradient); frozen
parameters are left out. Clip with `opt.clip_grad_norm_` (a norm of `p.grad` is refused: clipping.py).

Read zero_naive.py first: the same three steps on one flat buffer of the whole model, in 80 lines. What each
addition here is for: pieces per parameter (param groups, a `step` each, a parameter without a gradient left alone,
where one flat shard would move it); one buffer per dtype (mixed dtypes); stage 2's reduce-scatter at the end of
each backward (full gradients never outlive it, micro-batches included); `no_sync()`; `clip_grad_norm_`; and
`state_dict()` in one process's format (zero_state.py).
"""
from __future__ import annotations

import contextlib

import torch

from partrain_edu.parallel import clipping
from partrain_edu.parallel.buckets import OncePerBackward
from partrain_edu.parallel.ddp import broadcast_tensors
from partrain_edu.parallel.flat_shard import FlatShard, by_dtype
from partrain_edu.parallel.zero_state import full_state_dict, load_full_state_dict, mirror_hyperparameters

# Optimizers whose update of an element reads only that element's parameter, gradient and state: splitting a
# parameter across ranks then changes nothing. LAMB/LARS-style trust ratios or Adafactor's factored moments
# read whole-tensor norms and would not.
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, torch.optim.RMSprop,
               torch.optim.Adamax, torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adadelta)


class ZeroOptimizer(torch.optim.Optimizer):
    """`optimizer_class` over this rank's pieces of the trainable parameters; averages the gradients itself
    (use it on a plain replica, not inside DDP). `step()` = reduce-scatter, update the pieces, all-gather.
    `state_dict()` / `load_state_dict()` speak the single-process format (every rank must call them)."""

    def __init__(self, params, optimizer_class=torch.optim.AdamW, stage: int = 1, group=None,
                 elementwise: bool = False, **defaults):
        if stage not in (1, 2):
            raise ValueError(f"stage must be 1 (optimizer states) or 2 (+ gradients), got {stage}; "
                             "stage 3 shards the parameters too: use FullyShardedDataParallel")
        if not (elementwise or issubclass(optimizer_class, ELEMENTWISE)):
            raise ValueError(f"{optimizer_class.__name__} may read whole-tensor norms; ZeroOptimizer splits tensors "
                             "across ranks, so it supports elementwise optimizers (SGD, Adam, AdamW, ...): pass "
                             "elementwise=True if yours is one")
        self._building = True
        super().__init__(params, defaults)
        self.stage, self.group = stage, group
        trainable = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not trainable:
            raise ValueError("ZeroOptimizer got no parameter with requires_grad=True: nothing to train")
        broadcast_tensors(trainable, group)
        self.flats = [FlatShard(ps, group, keep_full=True) for ps in by_dtype(trainable)]
        self.where = {id(p): (f, i) for f in self.flats for i, p in enumerate(f.params)}   # → (FlatShard, index)
        inner_groups = [{**{k: v for k, v in g.items() if k != "params"},
                         "params": [self._piece(p) for p in g["params"] if p.requires_grad]} for g in self.param_groups]
        self.inner = optimizer_class(inner_groups, **defaults)
        # the optimizer's own defaults (betas, eps, …), visible here; step() then mirrors ours to it
        mirror_hyperparameters(self.inner.param_groups, self.param_groups, missing_only=True)
        self.state = self.inner.state                           # this rank's states, keyed by piece
        self._grads = {id(f): None for f in self.flats}         # (s,) reduced gradient, summed over backwards
        self._used = {id(f): [False] * len(f.params) for f in self.flats}
        self._sync, self._reduced = True, False                 # _reduced: stage 1's this step (clipping)
        self._end = OncePerBackward(self.reduce_gradients)      # stage 2: reduce-scatter as each backward ends
        self._hooks = [p.register_post_accumulate_grad_hook(self._accumulated) for p in trainable]
        if stage == 2:                                          # a dropped gradient's placeholder goes first
            self._hooks += [p.register_hook(lambda g, p=p: self._drop_placeholder(p)) for p in trainable]
        self._building = False

    def _accumulated(self, p) -> None:
        """After autograd adds into p.grad: hand it out as this rank's own (norms refused); stage 2 reduces at
        the end of this backward unless inside no_sync()."""
        p.grad = clipping.mark(p.grad, clipping.ZERO_STAGE1)
        if self.stage == 2 and self._sync:
            self._end.arm()

    @staticmethod
    def _drop_placeholder(p) -> None:
        if clipping.is_placeholder(p.grad):
            p.grad = None                                       # the next backward starts from None

    @staticmethod
    def _full_grad(p):
        return None if clipping.is_placeholder(p.grad) else p.grad

    @contextlib.contextmanager
    def no_sync(self):
        """Micro-batches whose backward only accumulates into p.grad: stage 2 reduce-scatters once, at the end
        of the first backward after it (stage 1 always reduces once, in step())."""
        self._sync = False
        try:
            yield
        finally:
            self._sync = True

    def _piece(self, p: torch.Tensor) -> torch.Tensor:
        flat, i = self.where[id(p)]
        return flat.pieces[i]

    def add_param_group(self, param_group: dict) -> None:
        if not self._building:
            raise ValueError("ZeroOptimizer lays its parameters out once: pass every param group to the constructor")
        super().add_param_group(param_group)

    @torch.no_grad()
    def reduce_gradients(self) -> None:
        """Reduce-scatter the full gradients into this rank's chunk (summed over calls) and drop them.
        `step()` calls it; under stage 2 the end of every backward does, so only the chunk stays resident."""
        for flat in self.flats:
            grads = [self._full_grad(p) for p in flat.params]
            part = flat.reduce_scatter_mean(flat.flatten(grads))   # (s,) all ranks, even with no gradient
            mine = self._grads[id(flat)]
            self._grads[id(flat)] = part if mine is None else mine.add_(part)
            self._used[id(flat)] = [u or g is not None for u, g in zip(self._used[id(flat)], grads, strict=True)]
            if self.stage == 2:                                 # a placeholder: torch's clip is refused
                for p, g in zip(flat.params, grads, strict=True):
                    p.grad = None if g is None else clipping.placeholder(p, clipping.ZERO_STAGE2)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # 1. reduce-scatter: this rank's chunk of the averaged gradient (stage 2: done as each backward ended)
        self._reduce_now()
        for flat in self.flats:
            flat.set_piece_grads(self._grads[id(flat)], self._used[id(flat)])
        # 2. update this rank's pieces, under our groups' hyperparameters (an LR scheduler writes ours)
        mirror_hyperparameters(self.param_groups, self.inner.param_groups)
        self.inner.step()
        # 3. all-gather: every replica gets every updated chunk
        for flat in self.flats:
            flat.all_gather(out=flat.full)
        if self.stage == 1:
            self._clear_reduced()                               # stage 1's resident gradients are the full ones
        return loss

    def _reduce_now(self) -> None:
        if self.stage == 1 and not self._reduced:               # reduce what autograd accumulated, once
            self._clear_reduced()
            self.reduce_gradients()
            self._reduced = True
        elif self.stage == 2 and any(self._full_grad(p) is not None for f in self.flats for p in f.params):
            self.reduce_gradients()                             # a backward this optimizer did not see end

    def _clear_reduced(self) -> None:
        for flat in self.flats:
            flat.set_piece_grads(None, [False] * len(flat.params))
            self._grads[id(flat)], self._used[id(flat)] = None, [False] * len(flat.params)
        self._reduced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        for flat in self.flats:
            for p in flat.params:
                self._drop_placeholder(p)
        super().zero_grad(set_to_none)
        self._clear_reduced()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False):
        """Clip the averaged gradient by its true norm, returned: reduce-scatter now (stage 1: the one of this
        step; step() then does not repeat it), one all-reduce of the chunks' Σ|g|ᵖ, scale the chunks."""
        self._reduce_now()
        chunks = self.gradient_shards()
        return clipping.clip_shards_(chunks, max_norm, norm_type, self.group, error_if_nonfinite,
                                     device=self.flats[0].data.device)

    def gradient_shards(self) -> list[torch.Tensor]:
        """The reduced gradient chunks alive now (stage 2 keeps them from backward until `zero_grad`)."""
        return [g for g in self._grads.values() if g is not None]

    # -- the single-process format, gathered and cut again: zero_state.py -----------------------------------
    def state_dict(self) -> dict:
        """The single-process optimizer's state dict (full states, parameters numbered across groups)."""
        return full_state_dict(self)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a single-process state dict (from `state_dict()` or a plain optimizer): keep this rank's pieces."""
        load_full_state_dict(self, state_dict)
