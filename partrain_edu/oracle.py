"""The course's oracle for a learner's own model: the same training on one process and wrapped on every rank.

    worst = against_one_process(MyNet, wrap=lambda m: DistributedDataParallel(m))   # every rank calls it

Both copies start from the same seed and see the same batches; the reference trains on the whole batch, the
wrapped copy on this rank's 1/n of it. Data parallelism averages the ranks' gradients, which equals the whole
batch's gradient when the loss is a mean over equal slices: the parameters must agree to float32 rounding.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _batch(step: int, size: int, features: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(size, features, generator=g), torch.randint(0, classes, (size,), generator=g)


def _full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state under the plain model's names (DDP's `module.` prefix dropped; FSDP gathers)."""
    return {k.removeprefix("module."): v for k, v in model.state_dict().items()}


def against_one_process(build: Callable[[], nn.Module], wrap: Callable[[nn.Module], nn.Module] = lambda m: m,
                        optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None, steps: int = 5,
                        batch: int = 8, features: int = 6, classes: int = 3, seed: int = 0) -> float:
    """Largest |difference| between one process's parameters and the wrapped model's after `steps` steps.

    `build()` makes the model (its forward takes `(x, step)`: x of shape (B, features), step an int, so a
    branch may depend on the step); `wrap` applies the parallelism; `optimizer(model)` makes its optimizer
    (default AdamW, lr 1e-2) — pass a ZeroOptimizer here. Classification loss over `classes`."""
    if batch % dist.get_world_size():
        raise ValueError(f"batch={batch} must be divisible by the {dist.get_world_size()} ranks")
    optimizer = optimizer or (lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    torch.manual_seed(seed)
    reference = build()
    torch.manual_seed(seed)
    wrapped = wrap(build())
    opts = optimizer(reference), optimizer(wrapped)
    share = batch // dist.get_world_size()
    mine = slice(dist.get_rank() * share, (dist.get_rank() + 1) * share)
    for step in range(steps):
        x, y = _batch(step, batch, features, classes)
        for model, opt, xs, ys in ((reference, opts[0], x, y), (wrapped, opts[1], x[mine], y[mine])):
            opt.zero_grad()
            F.cross_entropy(model(xs, step), ys).backward()
            opt.step()
    ours = _full_state(wrapped)
    return max(float((ours[k].float() - v.float()).abs().max()) for k, v in reference.state_dict().items())
