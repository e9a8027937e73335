"""Exercise 11: a real 1F1B pipeline executor (流水线并行) on 4 ranks, one stage each.

Graded in one launch on 3 steps drawn per run (trials.py), each with its own micro-batch count m (one below
p − 1, one at least p, one anywhere from 1 to 2p: their order drawn too), rows per micro-batch, boundary width H,
inner width of every stage's MLP (H → w_s → H) and data. After each step every stage's parameter gradients (and
the last stage's losses) equal one process running the whole model on all m micro-batches, loss_i = MSE / m; the
messages are only between neighbours, one activation forward and one gradient backward per micro-batch and
boundary (a middle stage sends 2m and receives 2m), each the size of one micro-batch; the activations autograd
keeps alive, measured as bytes of distinct saved tensors (weights left out, parallel.saved_bytes), never exceed
the bound 1F1B guarantees, min(p − s, m) micro-batches on stage s, where GPipe's order keeps all m; and the order
the messages show is 1F1B's (min(p − s − 1, m) warm-up forwards, then one forward / one backward, then the
cool-down backwards). A problem is told by step, then in the order the quantities arise (losses, gradients from
the last stage down, messages, memory, order). PipeDream-Flush / 1F1B: Narayanan et al. 2021 §2.2.1; GPipe:
Huang et al. 2019.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ
from partrain_edu.grading.givens import pipeline_executor as p2p
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import Problem, register
from partrain_edu.grading.trials import stream
from partrain_edu.parallel.saved_bytes import SavedBytes

STAGES, STEPS = 4, 3
SENDS, RECEIVES = ("send", "isend"), ("recv", "irecv")
PARAMETERS = ("first Linear's weight", "first Linear's bias", "second Linear's weight", "second Linear's bias")
# When in a step a problem arises: the losses (forward), each stage's gradients (backward, from the last stage
# down), then what the whole step shows: its messages, their sizes, its memory, its order.
LOSSES, GRADIENTS, MESSAGES, SIZES, MEMORY, ORDER = range(6)


@dataclass(frozen=True)
class Step:
    microbatches: int          # m
    rows: int                  # rows of one micro-batch
    hidden: int                # H: the width of every stage's input and output, so of every message
    inner: tuple[int, ...]     # per stage, the width inside its MLP
    torch_seed: int

    def where(self, index: int, stage: int) -> str:
        m = self.microbatches
        return (f"step {index + 1} of {STEPS} (m = {m} micro-batch{'es' if m > 1 else ''} of "
                f"{self.rows}×{self.hidden}), stage {stage} of {STAGES}")

    @property
    def message_bytes(self) -> int:
        return self.rows * self.hidden * 4   # one activation, or its gradient, in float32


def steps(seed: int) -> list[Step]:
    """The run's steps: m < p − 1 (stage 0 has fewer micro-batches than warm-up slots), m ≥ p, and any m."""
    rng = stream(seed, "pipeline_executor")
    counts = [rng.randint(1, STAGES - 2), rng.randint(STAGES, 2 * STAGES), rng.randint(1, 2 * STAGES)]
    rng.shuffle(counts)
    return [Step(m, rng.randint(1, 3), rng.randint(3, 10), tuple(rng.randint(2, 12) for _ in range(STAGES)),
                 rng.getrandbits(31)) for m in counts]


def stage_module(step: Step, stage: int) -> nn.Module:
    """Stage s's own layers, the same on the ranks and here: seeded by the step and the stage."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(step.torch_seed + stage)
        h, w = step.hidden, step.inner[stage]
        return nn.Sequential(nn.Linear(h, w), nn.Tanh(), nn.Linear(w, h), nn.Tanh())


def batch(step: Step) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The m input micro-batches and their targets."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(step.torch_seed + 1000)
        shape = (step.rows, step.hidden)
        return ([torch.randn(shape) for _ in range(step.microbatches)],
                [torch.rand(shape) * 2 - 1 for _ in range(step.microbatches)])


def observe(ctx, one_f_one_b_step, *, seed: int) -> dict:
    # torch imports this (and sympy) at a process's first backward given a gradient: seconds, which every
    # stage would otherwise spend in turn while its neighbours wait, inside the step.
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    out = []
    for step in steps(seed):
        module = stage_module(step, ctx.rank)
        inputs, targets = batch(step)
        counter = SavedBytes(module)
        dist.barrier()   # the steps start together: no message of one step is taken for the next one's
        with CommTracer() as tracer, counter:
            try:
                losses = one_f_one_b_step(module, ctx.rank, ctx.world_size, inputs, targets, F.mse_loss)
            except NotImplementedError:
                raise
            except Exception as exc:   # said with the step it happened in: the learner cannot see the steps
                raise RuntimeError(failed(step, exc)) from exc
        try:
            losses = torch.stack([torch.as_tensor(v, dtype=torch.float32).detach().reshape(()) for v in losses])
        except (TypeError, RuntimeError, ValueError):
            pass  # reported as what it is
        out.append({"grads": [tensor(p.grad) for p in module.parameters()], "losses": tensor(losses),
                    "peak_bytes": counter.peak, "messages": [[r.op, r.peer, r.bytes] for r in tracer.records]})
    return {"steps": out}


def failed(step: Step, exc: Exception) -> str:
    """What a rank says when the learner's step raised: which step, and what."""
    said = (f"your step with m = {step.microbatches} micro-batch{'es' if step.microbatches > 1 else ''} of "
            f"{step.rows}×{step.hidden} raised {type(exc).__name__}: {exc}")
    # Every stage starts with a Linear taking the step's width: a product that does not fit is a received
    # tensor of another shape.
    if isinstance(exc, RuntimeError) and "cannot be multiplied" in str(exc):
        said += (f" — a received tensor has another shape than this step's micro-batches ({step.rows}×"
                 f"{step.hidden}): receive with microbatches[0].shape, never a fixed shape")
    return said


def contributions(step: Step, stage: int) -> tuple[list[list[torch.Tensor]], torch.Tensor, int]:
    """One process, the whole model: each micro-batch's gradient of stage `stage`'s parameters
    ([micro-batch][param]), the m losses (each / m), and the bytes one micro-batch leaves saved on that stage."""
    modules = [stage_module(step, s) for s in range(STAGES)]
    inputs, targets = batch(step)
    params = list(modules[stage].parameters())
    per_mb = []
    losses = []
    saved = 0
    with torch.enable_grad():  # the learner's kernel may have turned autograd off
        for x, y in zip(inputs, targets, strict=True):
            counter = SavedBytes(params)
            for s, layer in enumerate(modules):
                if s == stage:  # cut the graph here, as the stage does with what it receives
                    x = x.detach().requires_grad_(stage > 0)
                with counter if s == stage else contextlib.nullcontext():
                    x = layer(x)
                    if s == STAGES - 1:
                        x = F.mse_loss(x, y) / step.microbatches  # the last stage's output is the loss
            per_mb.append(list(torch.autograd.grad(x, params)))
            losses.append(x.detach())
            saved = counter.peak
    return per_mb, torch.stack(losses), saved


def one_f_one_b_order(stage: int, m: int) -> list[str]:
    warmup = min(STAGES - stage - 1, m)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(m - warmup):
        order += [f"F{warmup + i}", f"B{i}"]
    return order + [f"B{i}" for i in range(m - warmup, m)]


def explain(per_mb: list[torch.Tensor], got) -> str:
    """Which micro-batches' gradients `got` is made of (least squares over the m contributions), in words."""
    if not isinstance(got, torch.Tensor) or got.shape != per_mb[0].shape:
        return ""
    basis = torch.stack([g.reshape(-1).double() for g in per_mb], 1)
    coef = torch.linalg.lstsq(basis, got.reshape(-1, 1).double()).solution.reshape(-1)
    if float((basis @ coef - got.reshape(-1).double()).norm()) > 1e-3 * float(got.norm()) + 1e-8:
        return ""  # not a combination of whole micro-batches: the values themselves are wrong
    k = [round(float(c), 2) for c in coef]
    m = len(k)
    if len(set(k)) == 1:
        return (f" Every micro-batch's gradient counts {k[0]:g} times: divide each micro-batch's loss by m = {m} "
                "before its backward (the step's loss is the mean over micro-batches)" if k[0] == m else
                f" Every micro-batch's gradient counts {k[0]:g} times instead of once.")
    missing = [i for i, c in enumerate(k) if c == 0]
    if set(k) <= {0.0, 1.0}:
        return (f" Micro-batch(es) {missing} are missing from .grad: gradients must accumulate over all m "
                "micro-batches — no zero_grad() (or .grad = None) between them, and every stashed micro-batch "
                "needs its backward")
    return f" Each micro-batch's gradient counts {k} times; each should count once."


def _values(step: Step, index: int, me: int, n: int, observed: Reader, per_mb: list, losses) -> Problem | None:
    where = step.where(index, me)
    if me == n - 1:
        problem = differ(f"{where}, the losses you returned (one per micro-batch)", losses,
                         observed["losses"].tensor())
        if problem:
            return Problem(problem + ". Hint: return the m losses you backpropagated, loss_fn(output, target) / m "
                           "each", at=(index, LOSSES))
    for i, got in enumerate(g.tensor() for g in observed["grads"].items(len(PARAMETERS))):
        want = torch.stack([mb[i] for mb in per_mb]).sum(0)
        problem = differ(f"{where}, gradient of its {PARAMETERS[i]} after the step", want, got)
        if problem:
            return Problem(problem + "." + (explain([mb[i] for mb in per_mb], got) or
                                            " Hint: run each stashed (input, output) pair's backward with the "
                                            "gradient received for that micro-batch, in the order the "
                                            "micro-batches went forward"), at=(index, GRADIENTS, n - 1 - me))
    return None


def _messages(step: Step, index: int, me: int, n: int, trace: list[tuple]) -> Problem | None:
    m, where = step.microbatches, step.where(index, me)
    other = sorted({op for op, _, _ in trace if op not in SENDS + RECEIVES})
    if other:
        return Problem(f"{where} called {other}: a pipeline stage only sends to and receives from its neighbours",
                       at=(index, MESSAGES, me))
    expected = {("send", me + 1): m, ("send", me - 1): m, ("recv", me - 1): m, ("recv", me + 1): m}
    expected = {k: v for k, v in expected.items() if 0 <= k[1] < n}
    seen: dict[tuple[str, object], int] = {}
    for op, peer, _ in trace:
        key = ("send" if op in SENDS else "recv", peer)
        seen[key] = seen.get(key, 0) + 1
    if seen != expected:
        def words(counts: dict) -> str:
            return ", ".join(f"{c} {kind}(s) {'to' if kind == 'send' else 'from'} stage {peer}"
                             for (kind, peer), c in sorted(counts.items(), key=str))
        return Problem(f"{where}: made {words(seen) or 'no messages'}; expected {words(expected)} — one "
                       f"activation forward and one gradient backward per micro-batch across each boundary "
                       f"({len(trace)} messages where 1F1B makes {sum(expected.values())})", at=(index, MESSAGES, me))
    sizes = sorted({size for _, _, size in trace})
    if sizes != [step.message_bytes]:
        return Problem(f"{where}: messages of {sizes} bytes; each should carry one micro-batch's activation or "
                       f"gradient, {step.rows}×{step.hidden} float32 = {step.message_bytes} bytes",
                       at=(index, SIZES, me))
    return None


def _memory(step: Step, index: int, me: int, n: int, peak: int, saved: int) -> Problem | None:
    m, where = step.microbatches, step.where(index, me)
    bound = min(n - me, m)
    if peak <= bound * saved:
        return None
    return Problem(f"{where}: at its peak autograd kept {peak} bytes of activations alive, {peak / saved:g} "
                   f"micro-batches (one saves {saved} bytes); 1F1B keeps at most min(p − s, m) = {bound}"
                   + (" — that is GPipe's order (all forwards, then all backwards), which keeps all m. "
                      if peak >= m * saved else ". ")
                   + "Hint: warm up with min(p − s − 1, m) forward(s), then alternate one forward and one "
                   "backward, freeing each micro-batch at its backward", at=(index, MEMORY, me))


def _order(step: Step, index: int, me: int, n: int, trace: list[tuple]) -> Problem | None:
    # Forward i starts with its activation's arrival (stage 0: ends with its send); backward i starts with its
    # gradient's arrival (last stage: ends with its send). Messages travel in order, so they number themselves.
    forward = ("send", 1) if me == 0 else ("recv", me - 1)
    backward = ("send", me - 1) if me == n - 1 else ("recv", me + 1)
    order, count = [], {"F": 0, "B": 0}
    for op, peer, _ in trace:
        key = ("send" if op in SENDS else "recv", peer)
        kind = "F" if key == forward else "B" if key == backward else None
        if kind:
            order.append(f"{kind}{count[kind]}")
            count[kind] += 1
    want = one_f_one_b_order(me, step.microbatches)
    if order == want:
        return None
    # The learner's order may be longer or shorter than 1F1B's: compare the common prefix.
    at = next((i for i, (a, b) in enumerate(zip(order, want, strict=False)) if a != b), min(len(order), len(want)))
    mine = order[at] if at < len(order) else "nothing more"
    theirs = want[at] if at < len(want) else "nothing more"
    return Problem(f"{step.where(index, me)}: your messages show the order {' '.join(order)}; 1F1B's is "
                   f"{' '.join(want)} — they part at action {at + 1} ({mine} where 1F1B runs {theirs}). Hint: "
                   "warm up with exactly min(p − s − 1, m) forward(s) (fewer leave the stages waiting on each "
                   "other: a bigger bubble, 气泡), then one forward and one backward, then the remaining backwards",
                   at=(index, ORDER, me))


@register("pipeline_executor", nproc=STAGES, observe=observe, given={name: getattr(p2p, name) for name in p2p.__all__},
          summary="one 1F1B step on 4 stages, for several micro-batch counts m per run (below and above p, with "
          "fresh widths and data): every stage's gradients (and the losses) equal one process running the whole "
          "model; messages only between neighbours, 2m sent and 2m received by a middle stage, in 1F1B's order; "
          "stage s kept at most min(p − s, m) micro-batches of activations alive (GPipe: all m)",
          deadlock_hint="Likely: two neighbouring stages wait for each other. A send blocks until the "
          "neighbour receives, so in the steady phase stage s sending its activation (send_forward) while s + 1 "
          "sends a gradient (send_backward) waits for ever: post each pair together with "
          "send_forward_recv_backward / send_backward_recv_forward (Megatron-LM does). Or a receive comes "
          "before the send it waits for (recv_backward before send_forward), or a stage's warm-up is not "
          "min(p − s − 1, m) forwards, so it waits for a message its neighbour sends later. The check runs "
          "several steps, with m below p − 1 as well as above p.",
          mismatch_hint="Every message carries one micro-batch, of shape microbatches[0].shape, and the check "
          "draws m, the rows and the width afresh for each step: take the shape from the micro-batches, never "
          "a fixed one. Else a receive met a send of another kind: count each stage's warm-up forwards again.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    for index, (step, seen) in enumerate(zip(steps(seed), observed["steps"].items(STEPS), strict=True)):
        per_mb, losses, saved = contributions(step, me)   # the oracle: one process, the whole model
        problem = _values(step, index, me, n, seen, per_mb, losses)
        if problem:
            return [problem]
        trace = seen["messages"].records(("name", "peer", "count"), what="messages")   # (op, peer, bytes)
        problem = (_messages(step, index, me, n, trace) or
                   _memory(step, index, me, n, seen["peak_bytes"].count(), saved) or _order(step, index, me, n, trace))
        if problem:
            return [problem]
    return []
