"""ZeRO-3 / FSDP from scratch: parameters, gradients and optimizer states all sharded; a unit is gathered
only while it computes.

    partrain-edu train --strategy zero3 --nproc 2 --steps 20 --json

Rajbhandari et al. 2020 ("ZeRO", §5.3 P_os+g+p, §7.2.2) and Zhao et al. 2023 ("PyTorch FSDP", §3): the model
is cut into units — each transformer block, plus the rest (embeddings, final layernorm, head: the root).
Each unit's parameters are flattened, padded to a multiple of n and sharded (`zero.FlatShard`,
keep_full=False): a rank keeps only its (⌈Ψ_u/n⌉,) chunk, the parameter the optimizer updates.

Sharded (fp32 + AdamW): params 4⌈Ψ/n⌉, grads 4⌈Ψ/n⌉, optimizer 8⌈Ψ/n⌉ per rank (`theory.memory`, stage 3;
each unit padded on its own — TinyGPT's units are multiples of 4, so at n ∈ {1, 2, 4} nothing is padded; at
n = 3 the shards exceed ⌈Ψ/n⌉ by under one element per unit), plus one
AdamW `step` scalar per unit. The transient peak adds the gathered units: the root (gathered for the whole
forward, as FSDP keeps the root) plus one block — `peak_gathered_bytes` measures it.

Communicated per micro-batch, for every unit (ZeRO §7.2.2): all-gather before its forward; all-gather again
before its backward (it was freed after forward); reduce-scatter of its gradient after its backward:
3 × (n−1)/n·Ψ·4 bytes = 1.5× DDP's 2(n−1)/n·Ψ·4.

How, in plain autograd:
- `_Gather` (an autograd Function) all-gathers a unit's shard into a (padded,) buffer in forward; its backward
  receives the buffer's gradient — summed over every use of every parameter of the unit — and reduce-scatters
  it into the shard's gradient. The module's weights are views of the gathered buffer while the unit runs.
- Autograd would keep the gathered buffer alive until backward (Linear saves its weight). A
  `saved_tensors_hooks` pair stores "this unit, this offset/shape" instead of the tensor, so the buffer is freed
  after forward; the first unpack in backward gathers it again. The gradient's reduce-scatter frees it.
- prefetch=True issues the next unit's all-gather asynchronously before the current unit computes (forward:
  block i+1; backward: block i−1), so communication overlaps compute; `timeline` records (event, unit,
  time) when each gather is issued, when it is ready (waited for) and when the unit is done computing.
"""
from __future__ import annotations

import time

import torch
import torch.nn as nn

from partrain_edu.parallel.ddp import broadcast_parameters
from partrain_edu.parallel.zero import FlatShard, optimizer_state_tensors
from partrain_edu.train import Strategy, register


class _Gather(torch.autograd.Function):
    """shard (s,) → full (padded,) by all-gather; backward: grad (padded,) → reduce-scatter mean (s,)."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, unit: "Unit") -> torch.Tensor:
        ctx.unit = unit
        return unit.take_gathered()

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        unit = ctx.unit
        unit.owner.log("done", unit)                      # this unit's backward has computed
        if unit.backward_full is not None:                # free the buffer gathered for backward
            unit.owner.track(-unit.backward_full.numel() * unit.backward_full.element_size())
            unit.backward_full = None
        return unit.flat.reduce_scatter_mean(grad_full.contiguous()), None


class Unit:
    """One FSDP unit: a module whose own parameters are sharded (its children units excluded)."""

    def __init__(self, index: int, module: nn.Module, owned: list[tuple[nn.Module, str]], owner: "ShardedModel"):
        self.index, self.module, self.owner, self.owned = index, module, owner, owned
        self.flat = FlatShard([getattr(m, name) for m, name in owned], owner.group, keep_full=False)
        for m, name in owned:                             # plain attributes from now on, set while running
            del m._parameters[name]
            setattr(m, name, None)
        self.full: torch.Tensor | None = None             # (padded,) gathered for forward
        self.backward_full: torch.Tensor | None = None    # (padded,) gathered again for backward
        self._pending = None                              # (buffer, work) of a prefetched all-gather

    def prefetch(self) -> None:
        if self._pending is None:
            self._pending = self.flat.all_gather(async_op=True)
            self.owner.track(self._pending[0].numel() * self._pending[0].element_size())
            self.owner.log("issue", self)

    def take_gathered(self) -> torch.Tensor:
        """The full buffer: the prefetched one once its all-gather is done, else gathered now."""
        if self._pending is None:
            self.prefetch()
        out, work = self._pending
        self._pending = None
        work.wait()
        self.owner.log("ready", self)
        return out

    def gather_for_forward(self) -> None:
        self.full = _Gather.apply(self.flat.shard, self)  # (padded,) in the graph: gradients flow to the shard
        for (m, name), view in zip(self.owned, self.flat.views(self.full)):
            setattr(m, name, view)

    def free_after_forward(self) -> None:
        self.owner.log("done", self)                      # this unit's forward has computed
        for m, name in self.owned:
            setattr(m, name, None)
        self.owner.track(-self.full.numel() * self.full.element_size())
        self.full = None                                  # saved tensors hold a (unit, layout) key, not it

    def full_for_backward(self) -> torch.Tensor:
        if self.backward_full is None:
            self.backward_full = self.take_gathered()
            if self.owner.prefetch and self.index > 1:    # backward runs blocks in reverse: fetch the previous
                self.owner.units[self.index - 1].prefetch()
        return self.backward_full


class ShardedModel(nn.Module):
    """Wrap a TinyGPT: units = each block in `module.blocks`, plus the rest (unit 0, the root)."""

    def __init__(self, module: nn.Module, group=None, prefetch: bool = False):
        super().__init__()
        self.module, self.group, self.prefetch = module, group, prefetch
        broadcast_parameters(module, group)
        self.gathered_bytes_now, self.peak_gathered_bytes = 0, 0
        self.timeline: list[tuple[str, int, float]] = []
        blocks = list(module.blocks)
        block_params = {id(p) for b in blocks for p in b.parameters()}
        rest = [(m, n) for m in module.modules() for n, p in m._parameters.items()
                if p is not None and id(p) not in block_params]
        self.units = [Unit(0, module, rest, self)]
        self.units += [Unit(i + 1, b, [(m, n) for m in b.modules() for n, p in m._parameters.items() if p is not None],
                            self) for i, b in enumerate(blocks)]
        self.shards = nn.ParameterList([u.flat.shard for u in self.units])   # what the optimizer sees
        for u in self.units[1:]:
            u.module.register_forward_pre_hook(lambda mod, args, u=u: self._before(u))
            u.module.register_forward_hook(lambda mod, args, out, u=u: u.free_after_forward())

    def track(self, delta: int) -> None:
        """Bytes of gathered buffers alive now (+ when an all-gather allocates one, − when it is freed)."""
        self.gathered_bytes_now += delta
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes_now)

    def log(self, event: str, unit: Unit) -> None:
        self.timeline.append((event, unit.index, time.perf_counter()))

    def _before(self, unit: Unit) -> None:
        unit.gather_for_forward()
        if self.prefetch and unit.index + 1 < len(self.units):
            self.units[unit.index + 1].prefetch()        # overlaps with this unit's compute

    def _pack(self, t: torch.Tensor):
        for u in self.units:                             # a weight (or its transpose) viewing a gathered unit
            if u.full is not None and t._base is u.full:
                return (u, t.size(), t.stride(), t.storage_offset())
        return t

    def _unpack(self, packed):
        if isinstance(packed, tuple):
            unit, size, stride, offset = packed
            return unit.full_for_backward().as_strided(size, stride, offset)
        return packed

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            if self.prefetch and len(self.units) > 1:
                self.units[1].prefetch()
            self._before(self.units[0])                  # the root stays gathered through the forward
            try:
                return self.module(*args, **kwargs)
            finally:
                self.units[0].free_after_forward()
                if self.prefetch and len(self.units) > 1:
                    self.units[-1].prefetch()             # backward starts with the last block

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsharded parameters under the wrapped module's names (all-gathers every unit; every rank)."""
        out = {}
        with torch.no_grad():
            for u in self.units:
                full = u.flat.all_gather()
                for (m, name), view in zip(u.owned, u.flat.views(full)):
                    out[self._names[id(m)] + name] = view.clone()
        return out

    @property
    def _names(self) -> dict[int, str]:
        return {id(m): (n + "." if n else "") for n, m in self.module.named_modules()}


@register("zero3")
class Zero3(Strategy):
    def __init__(self, ctx, cfg, group=None, prefetch: bool = False):
        super().__init__(ctx, cfg)
        self.model = ShardedModel(self.new_model(), group, prefetch=prefetch)
        self.optimizer = self.new_optimizer(self.model.parameters())

    def state_tensors(self):
        shards = list(self.model.shards)
        return {"params": shards, "grads": [s.grad for s in shards if s.grad is not None],
                "optimizer": optimizer_state_tensors(self.optimizer)}
