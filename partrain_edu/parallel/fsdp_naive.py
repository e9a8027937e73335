"""ZeRO-3, naive (朴素版 FSDP): the whole model is one unit, its parameters one flat buffer of which a rank keeps 1/n.

    fsdp = NaiveFSDP(model, group); opt = torch.optim.AdamW(fsdp.parameters(), lr=3e-3)   # the shard only
    loss_fn(fsdp(my_slice), y).backward(); opt.step(); opt.zero_grad()                    # group: None = world

Rajbhandari et al. 2020, "ZeRO", arXiv:1910.02054, §5.3. **Sharded**: parameters, gradients, optimizer states;
rank k keeps elements [k·s, (k+1)·s) of the padded flat buffer (`fsdp.shard`, s = ⌈Ψ/n⌉). **Sent** per step
(§7.2.2): all-gather before forward (1), again in backward (3), reduce-scatter of the gradient (4): 3(n−1)/n·Ψ·bytes
(fp32: 4), 1.5× DDP's. After forward (2) autograd keeps (size, stride, offset) keys, not views (saved_tensors_hooks):
the buffer is freed until backward gathers it again; outside forward the weights are None. Run it on 2 ranks:
notebook 04, tests/test_naive_zero_fsdp.py. What fsdp.py's FullyShardedDataParallel adds: its docstring.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class _Gather(torch.autograd.Function):
    """shard (s,) → the whole flat buffer (n·s,); backward: the gradient's mean, reduce-scattered to the shard."""
    @staticmethod
    def forward(ctx, shard: torch.Tensor, owner: "NaiveFSDP") -> torch.Tensor:
        ctx.owner = owner
        return owner.all_gather()                                       # (1)

    @staticmethod
    def backward(ctx, grad_full: torch.Tensor):
        ctx.owner.again = None                                          # (4) backward is done with its buffer
        grad = torch.empty_like(ctx.owner.shard)                        # (s,)
        dist.reduce_scatter_single(grad, (grad_full / ctx.owner.n).contiguous(), group=ctx.owner.group)
        return grad, None                                               # autograd adds it into shard.grad


class NaiveFSDP(nn.Module):
    """`module` with its parameters replaced by this rank's flat shard (`parameters()` yields only it)."""
    def __init__(self, module: nn.Module, group):
        super().__init__()
        params = list(module.parameters())
        kinds = sorted({f"{p.dtype} on {p.device}, requires_grad={p.requires_grad}" for p in params})
        if len(kinds) != 1 or not kinds[0].endswith("True"):
            raise ValueError(f"NaiveFSDP shards ONE flat buffer: trainable parameters of one dtype, got {kinds}; "
                             "cast the model (model.float()) or use fsdp.FullyShardedDataParallel (frozen, dtypes)")
        self.module, self.group, self.n, self.again = module, group, dist.get_world_size(group), None
        for t in [*params, *module.buffers()]:                         # every rank shards rank 0's weights
            dist.broadcast(t.data, src=dist.get_global_rank(group or dist.group.WORLD, 0), group=group)
        self.shapes, self.sizes = [p.shape for p in params], [p.numel() for p in params]
        full = F.pad(torch.cat([p.detach().reshape(-1) for p in params]), (0, -sum(self.sizes) % self.n))  # (n·s,)
        self.shard = nn.Parameter(full.chunk(self.n)[dist.get_rank(group)].clone())   # (s,) the only copy kept
        self.slots = [[(m, k) for m in module.modules() for k, q in m._parameters.items() if q is p] for p in params]
        for m, k in (slot for slots in self.slots for slot in slots):  # a tied weight has two
            del m._parameters[k]                                        # forward fills the attribute
        self.set_weights(None)

    def all_gather(self) -> torch.Tensor:
        full = torch.empty(self.n * len(self.shard), dtype=self.shard.dtype, device=self.shard.device)   # (n·s,)
        dist.all_gather_single(full, self.shard.detach(), group=self.group)
        return full

    def set_weights(self, full: torch.Tensor | None) -> None:   # every parameter's attributes: a view of full, or None
        self.full = full
        views = full[:sum(self.sizes)].split(self.sizes) if full is not None else [None] * len(self.sizes)
        for view, shape, slots in zip(views, self.shapes, self.slots, strict=True):
            for m, k in slots:
                m.__dict__[k] = None if view is None else view.view(shape)

    def forward(self, *args, **kwargs):
        self.set_weights(_Gather.apply(self.shard, self))              # (1) in the graph, so (4) reaches the shard
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                return self.module(*args, **kwargs)
        finally:
            self.set_weights(None)                                      # (2) nothing holds the buffer any more

    def _pack(self, t: torch.Tensor):                                   # (2) a view of the buffer → a key
        return (t.size(), t.stride(), t.storage_offset()) if t._base is not None and t._base is self.full else t

    def _unpack(self, saved):                                           # (3) a key → the view, gathered again
        if isinstance(saved, tuple) and self.again is None:
            self.again = self.all_gather()
        return self.again.as_strided(*saved) if isinstance(saved, tuple) else saved
