"""Zero bubble's split backward (Qi et al. 2024, ZB-H1): B, the stage input's gradient now; W, the weights', later.

    partrain-edu train --strategy pp-zb1 --nproc 4 --pp 4 --microbatches 8 --json

**Sharded**: as pipeline.py (layers over stages). **Sent**: the same messages as 1F1B: B's input gradient goes
back at once, for the previous stage waits on it; W sends nothing, so the schedule fills the cool-down's idle
time with W's: the idle time per stage falls from (p−1)(F+B+W) to (p−1)(F+B−W), a third when F = B = W.
**Cost**: W needs its micro-batch's graph, so a stage holds p micro-batches' activations (1F1B: p − s).
**How**: B asks autograd for the gradients of the stage input and of every weighted module's output (a module
holding trainable parameters itself: Linear, LayerNorm, Embedding, …): autograd skips the edges nobody asked
for, so no weight gradient is computed. W then runs, from each such output and its gradient, only the edges into
that module's own parameters. `SplitBackward` is what `PipelineExecutor` calls for F, B and W.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn as nn
from torch.autograd.graph import get_gradient_edge


# We split per module rather than walk the autograd graph (torch's `stage_backward_input`): readable in a few
# lines, the same arithmetic for layers that apply their weight last (Linear, LayerNorm, Embedding; a module whose
# own weight feeds its children would redo their input gradients in W, correct but slower), and refused, never
# silently wrong, where a weight is reached other than through its own module's output (`check_split`).
def weighted_modules(chunk: nn.Module) -> list[nn.Module]:
    """The modules of `chunk` that hold a trainable parameter themselves (not only through children)."""
    return [mod for mod in chunk.modules() if any(p.requires_grad for p in mod.parameters(recurse=False))]


@contextmanager
def recording(modules: list[nn.Module]):
    """[(module, output)] of each weighted module's forward while the block runs (once each, a tensor)."""
    seen: list[tuple[nn.Module, torch.Tensor]] = []

    def hook(mod, args, out):
        if not isinstance(out, torch.Tensor) or any(m is mod for m, _ in seen):
            raise ValueError(f"B/W split needs each weighted module to return one tensor, once per forward; "
                             f"{type(mod).__name__} does not: use a schedule without W (1f1b)")
        seen.append((mod, out))
    handles = [mod.register_forward_hook(hook) for mod in modules]
    try:
        yield seen
    finally:
        for h in handles:
            h.remove()


def check_split(out: torch.Tensor, recorded, chunk: nn.Module) -> None:
    """Every path from `out` to a parameter must pass through its own module's output, or W would miss it
    (a weight used by another module, e.g. tied): a one-line ValueError. Walked once, on the first forward."""
    def reached(avoid) -> set[int]:  # ids of the parameters autograd reaches from `out` without passing `avoid`
        seen = set()
        todo = [out.grad_fn]
        found = set()
        while todo:
            node = todo.pop()
            if node is None or node is avoid or node in seen:
                continue
            seen.add(node)
            if hasattr(node, "variable"):   # an AccumulateGrad: a leaf's gradient lands here
                found.add(id(node.variable))
            todo.extend(n for n, _ in node.next_functions)
        return found
    owner = {id(mod): y.grad_fn for mod, y in recorded}
    for mod in weighted_modules(chunk):
        leak = reached(owner.get(id(mod))) & {id(p) for p in mod.parameters(recurse=False)}
        if leak:
            name = next(n for n, p in chunk.named_parameters() if id(p) in leak)
            raise ValueError(f"parameter {name} is reached other than through its module's output (shared or "
                             "tied?), so the B/W split cannot compute its gradient: use 1f1b")


def backward_input(out, grad, inp, recorded) -> tuple[torch.Tensor | None, list]:
    """B: the stage input's gradient and, kept for W, each weighted module's (output, output gradient)."""
    ys = [(mod, y) for mod, y in recorded if y.requires_grad]
    wanted = ([inp] if inp.requires_grad else []) + [y for _, y in ys]
    if not (out.requires_grad and wanted):
        return None, []
    grads = torch.autograd.grad(out, wanted, grad, retain_graph=True, allow_unused=True)  # the graph stays for W
    dys = grads[1:] if inp.requires_grad else grads
    # W needs each output's place in the graph (an edge), not its values: those are freed now, unless saved
    return (grads[0] if inp.requires_grad else None), [(mod, get_gradient_edge(y), dy)
                                                       for (mod, y), dy in zip(ys, dys, strict=True) if dy is not None]


def backward_weight(pending) -> None:
    """W: each weighted module's parameter gradients from its output's, accumulated into .grad as backward does."""
    for mod, edge, dy in pending:
        own = [p for p in mod.parameters(recurse=False) if p.requires_grad]
        torch.autograd.backward(edge, dy, inputs=own, retain_graph=True)  # the graph goes with the stash entry


class SplitBackward:
    """The executor's backward for its `chunks`: whole (`split=False`, GPipe and 1F1B), or B and W apart (ZB-H1).
    `record(c)` records chunk c's weighted outputs in its forward, `check` refuses a chunk W would get wrong
    (once each), `backward` runs the whole backward, or B and returns W's work for `backward_weight` later."""

    def __init__(self, chunks: list[nn.Module], split: bool):
        self.chunks, self.split = chunks, split
        self.weighted = [weighted_modules(c) if split else [] for c in chunks]   # unsplit: nothing recorded
        self.unchecked = set(range(len(chunks))) if split else set()

    def record(self, chunk: int):
        """Around chunk `chunk`'s forward: yields the [(module, output)] B will ask gradients for."""
        return recording(self.weighted[chunk])

    def check(self, chunk: int, out: torch.Tensor, recorded) -> None:
        if chunk in self.unchecked and out.requires_grad:
            check_split(out, recorded, self.chunks[chunk])
            self.unchecked.discard(chunk)

    def backward(self, out, grad, inp, recorded) -> tuple[torch.Tensor | None, list | None]:
        """(the stage input's gradient, W's work: None when the backward was whole)."""
        if self.split:                       # the input gradient only; W's share waits in the stash
            return backward_input(out, grad, inp, recorded)
        if out.requires_grad:                # not so only on a first stage without parameters
            out.backward(grad)
        return inp.grad, None
