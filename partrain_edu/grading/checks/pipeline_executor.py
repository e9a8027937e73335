"""Exercise 11: a real 1F1B pipeline executor (流水线并行) on 4 ranks, one stage each.

Graded: after one step of m = 6 micro-batches every stage's parameter gradients (and the last stage's losses)
equal one process running the whole 4-stage model on all micro-batches, loss_i = MSE / m; the messages are
only between neighbours, one activation forward and one gradient backward per micro-batch and boundary (a
middle stage sends 2m and receives 2m); the order the messages show is 1F1B's (p − s − 1 warm-up forwards,
then one forward / one backward, then the cool-down backwards); and the activations autograd keeps alive,
measured as bytes of distinct saved tensors (weights left out, parallel.saved_bytes), never exceed the
bound 1F1B guarantees: min(p − s, m) micro-batches on stage s, where GPipe's order keeps all m.
PipeDream-Flush / 1F1B: Narayanan et al. 2021 §2.2.1; GPipe: Huang et al. 2019.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ
from partrain_edu.grading.givens import pipeline_executor as p2p
from partrain_edu.grading.observations import Reader, tensor
from partrain_edu.grading.registry import register
from partrain_edu.parallel.saved_bytes import SavedBytes

STAGES, MICROBATCHES, BATCH, HIDDEN = 4, 6, 2, 8   # p, m, rows per micro-batch, width of every layer
MESSAGE_BYTES = BATCH * HIDDEN * 4                  # one activation, or its gradient, in float32
SENDS, RECEIVES = ("send", "isend"), ("recv", "irecv")


def stage_module(stage: int) -> nn.Module:
    """Stage s's own layers (Linear + Tanh), the same on the ranks and here: seeded by the stage."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1100 + stage)
        return nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh())


def batch() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The m input micro-batches and their targets."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1199)
        return ([torch.randn(BATCH, HIDDEN) for _ in range(MICROBATCHES)],
                [torch.rand(BATCH, HIDDEN) * 2 - 1 for _ in range(MICROBATCHES)])


def observe(ctx, one_f_one_b_step, *, seed: int) -> dict:
    # torch imports this (and sympy) at a process's first backward given a gradient: seconds, which every
    # stage would otherwise spend in turn while its neighbours wait, inside the step.
    import torch.fx.experimental.symbolic_shapes  # noqa: F401
    module = stage_module(ctx.rank)
    inputs, targets = batch()
    counter = SavedBytes(module)
    with CommTracer() as tracer, counter:
        losses = one_f_one_b_step(module, ctx.rank, ctx.world_size, inputs, targets, F.mse_loss)
    try:
        losses = torch.stack([torch.as_tensor(v, dtype=torch.float32).detach().reshape(()) for v in losses])
    except (TypeError, RuntimeError, ValueError):
        pass  # reported as what it is
    return {"grads": [tensor(p.grad) for p in module.parameters()], "losses": tensor(losses),
            "peak_bytes": counter.peak, "messages": [[r.op, r.peer, r.bytes] for r in tracer.records]}


def contributions(stage: int) -> tuple[list[list[torch.Tensor]], torch.Tensor, int]:
    """One process, the whole model: each micro-batch's gradient of stage `stage`'s parameters
    ([micro-batch][param]), the m losses (each / m), and the bytes one micro-batch leaves saved on that stage."""
    modules = [stage_module(s) for s in range(STAGES)]
    inputs, targets = batch()
    params = list(modules[stage].parameters())
    per_mb, losses, saved = [], [], 0
    with torch.enable_grad():  # the learner's kernel may have turned autograd off
        for x, y in zip(inputs, targets):
            counter = SavedBytes(params)
            for s, layer in enumerate(modules):
                if s == stage:  # cut the graph here, as the stage does with what it receives
                    x = x.detach().requires_grad_(stage > 0)
                with counter if s == stage else contextlib.nullcontext():
                    x = layer(x)
                    if s == STAGES - 1:
                        x = F.mse_loss(x, y) / MICROBATCHES  # the last stage's output is the loss
            per_mb.append(list(torch.autograd.grad(x, params)))
            losses.append(x.detach())
            saved = counter.peak
    return per_mb, torch.stack(losses), saved


def one_f_one_b_order(stage: int) -> list[str]:
    warmup = min(STAGES - stage - 1, MICROBATCHES)
    order = [f"F{i}" for i in range(warmup)]
    for i in range(MICROBATCHES - warmup):
        order += [f"F{warmup + i}", f"B{i}"]
    return order + [f"B{i}" for i in range(MICROBATCHES - warmup, MICROBATCHES)]


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


@register("pipeline_executor", nproc=STAGES, observe=observe, given={name: getattr(p2p, name) for name in p2p.__all__},
          summary="one 1F1B step on 4 stages × 6 micro-batches: every "
          "stage's gradients (and the losses) equal one process running the whole model; messages only between "
          "neighbours, 2m sent and 2m received by a middle stage, in 1F1B's order; stage s kept at most "
          "min(p − s, m) micro-batches of activations alive (GPipe: all m)",
          deadlock_hint="Likely: two neighbouring stages wait for each other. A send blocks until the "
          "neighbour receives, so in the steady phase stage s sending its activation (send_forward) while s + 1 "
          "sends a gradient (send_backward) waits for ever: post each pair together with "
          "send_forward_recv_backward / send_backward_recv_forward (Megatron-LM does). Or a receive comes "
          "before the send it waits for (recv_backward before send_forward), or a stage's warm-up is not "
          "p − s − 1 forwards, so it waits for a message its neighbour sends later.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    m, where = MICROBATCHES, f"stage {me} of {n}"
    per_mb, losses, saved = contributions(me)
    if me == n - 1:
        got = observed["losses"].tensor()
        problem = differ(f"{where}, the losses you returned (one per micro-batch)", losses, got)
        if problem:
            return [problem + ". Hint: return the m losses you backpropagated, loss_fn(output, target) / m each"]
    names = ["weight", "bias"]
    for i, got in enumerate(g.tensor() for g in observed["grads"].items(len(names))):
        want = torch.stack([mb[i] for mb in per_mb]).sum(0)
        problem = differ(f"{where}, gradient of its Linear {names[i]} after the step", want, got)
        if problem:
            return [problem + "." + (explain([mb[i] for mb in per_mb], got) or
                                     " Hint: run each stashed (input, output) pair's backward with the gradient "
                                     "received for that micro-batch, in the order the micro-batches went forward")]

    trace = observed["messages"].records(("name", "peer", "count"), what="messages")   # (op, peer, bytes)
    other = sorted({op for op, _, _ in trace if op not in SENDS + RECEIVES})
    if other:
        return [f"{where} called {other}: a pipeline stage only sends to and receives from its neighbours"]
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
        return [f"{where}: made {words(seen) or 'no messages'}; expected {words(expected)} — one activation "
                f"forward and one gradient backward per micro-batch across each boundary ({len(trace)} messages "
                f"where 1F1B makes {sum(expected.values())})"]
    sizes = sorted({size for _, _, size in trace})
    if sizes != [MESSAGE_BYTES]:
        return [f"{where}: messages of {sizes} bytes; each should carry one micro-batch's activation or "
                f"gradient, {BATCH}×{HIDDEN} float32 = {MESSAGE_BYTES} bytes"]

    peak, bound = observed["peak_bytes"].count(), min(n - me, m)
    if peak > bound * saved:
        return [f"{where}: at its peak autograd kept {peak} bytes of activations alive, {peak / saved:g} "
                f"micro-batches (one saves {saved} bytes); 1F1B keeps at most min(p − s, m) = {bound}"
                + (" — that is GPipe's order (all forwards, then all backwards), which keeps all m. "
                   if peak >= m * saved else ". ")
                + f"Hint: warm up with p − s − 1 = {n - me - 1} forward(s), then alternate one forward and one "
                "backward, freeing each micro-batch at its backward"]

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
    want = one_f_one_b_order(me)
    if order != want:
        step = next(i for i, (a, b) in enumerate(zip(order, want)) if a != b)
        return [f"{where}: your messages show the order {' '.join(order)}; 1F1B's is {' '.join(want)} — "
                f"they part at step {step + 1} ({order[step]} where 1F1B runs {want[step]}). Hint: warm up with "
                f"exactly p − s − 1 = {n - me - 1} forward(s) (fewer leave the stages waiting on each other: "
                "a bigger bubble, 气泡), then one forward and one backward, then the remaining backwards"]
    return []
