"""The trusted half of each multi-rank check: ring all-reduce, DDP buckets, ZeRO-1, tensor-parallel f/g and the
column→row parallel MLP. Runs in the caller (the grader for `partrain-edu check`, the kernel for a learner's
own `check(...)`), never on the ranks.

Each `verify(rank, n, observations) -> list[str]` reads one rank's observations (written by the matching
function of rank_observe.py, read through observations.Reader as untrusted data), recomputes the expected
values itself, single-process, from the seeds in rank_inputs.py — the sum of every rank's tensor, the gradient
of the mean loss over every rank's batch, unsharded SGD-momentum, the unsharded MLP — and words what differs
as a problem with a hint. It also grades the traffic the lesson is about (collective kinds, calls, bytes
against the ring cost model); those counts are self-reported by the ranks.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from partrain_edu.grading import rank_inputs as inputs
from partrain_edu.grading.compare import differ, ratio_of
from partrain_edu.grading.core import register
from partrain_edu.grading.observations import Reader
from partrain_edu.parallel.buckets import plan_buckets
from partrain_edu.parallel.ring import chunk_bounds, ring_bytes_sent_by

COLLECTIVES = {"all_reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "reduce_scatter_single",
               "all_gather_single"}


@register("ring_all_reduce", nproc=3, summary="sums equal dist.all_reduce for lengths 12, 7 and 2 on 3 ranks, "
          "and each rank sent exactly the ring's 2(n−1)/n·S bytes, point-to-point only, to its right neighbour only",
          deadlock_hint="Likely: every rank posts a blocking recv (or send) first, so all wait for a message "
          "nobody sends — post the receive with irecv and the send with isend, then wait on both; or two "
          "neighbours disagree on a chunk's size (use the same chunk boundaries on every rank).")
def ring_all_reduce(me: int, n: int, observed: Reader) -> list[str]:
    for numel, run in zip(inputs.RING_LENGTHS, observed.items(len(inputs.RING_LENGTHS))):
        given = [inputs.ring_input(numel, r) for r in range(n)]
        mine, expected = given[me], torch.stack(given).sum(0)
        got = run["out"].tensor()
        problem = differ(f"length {numel} on {n} ranks", expected, got)
        if problem:
            diagnosis, scaled = ring_diagnosis(expected, got, given, me)
            return [problem + diagnosis + ("" if scaled else " Hint: rank r sends chunk (r − s − 1) mod n and "
                    "adds the one it receives in reduce-scatter step s, then forwards chunk (r − s) mod n in "
                    "all-gather step s; chunk boundaries must match on every rank (first numel % n chunks one "
                    "longer).")]
        used = sorted(set(run["ops"].counts()) & COLLECTIVES)
        if used:
            return [f"length {numel}: you called {used}; build the all-reduce from isend/irecv (send/recv) only"]
        peers = {op: set(run["peers"][op].numbers()) for op in run["peers"].keys()}
        right, left = (me + 1) % n, (me - 1) % n
        sent_to = peers.get("isend", set()) | peers.get("send", set())
        heard_from = peers.get("irecv", set()) | peers.get("recv", set())
        if not sent_to <= {right} or not heard_from <= {left}:
            return [f"length {numel}: rank {me} sent to rank(s) {sorted(sent_to)} and received from "
                    f"{sorted(heard_from)}; in a ring each rank sends only to its right neighbour ({right}) and "
                    f"receives only from its left ({left}) — every link carries 1/n of the tensor per step"]
        want, sent = ring_bytes_sent_by(me, numel, mine.element_size(), n), run["sent"].count()
        if sent != want:
            return [f"length {numel}: sent {sent} bytes, the ring sends exactly {want} (2(n−1)/n·S with S = "
                    f"{numel * mine.element_size()} B: every chunk but one per phase). "
                    + ("More means whole tensors or extra chunks travel." if sent > want else
                       "Less means some chunk never travelled.")]
    return []


def ring_diagnosis(expected: torch.Tensor, got, given: list[torch.Tensor], me: int) -> tuple[str, bool]:
    """What the first wrong element holds, and whether the answer scaled rank `me`'s input. The element is read
    as the sum of a set of the ranks' inputs `given` at one position (their 2^r tags, rank_inputs.ring_input)
    when it is one; otherwise it is said to be no such sum: a ring only adds and moves chunks, so something else
    changed it."""
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape:
        return ".", False
    got, expected = got.double().reshape(-1), expected.double().reshape(-1)
    wrong = next((i for i in range(got.numel()) if abs(got[i] - expected[i]) > 1e-4), None)
    if wrong is None:
        return ".", False
    value, want = float(got[wrong]), float(expected[wrong])
    scale = ratio_of(given[me].double().reshape(-1), got)
    if scale is not None and abs(scale - 1) > 1e-3:
        return (f". Element {wrong} holds {value:g}, which is no sum of the ranks' inputs (expected {want:g}): every "
                f"element is {scale:g}× this rank's own input — each element must be added to the other ranks' "
                "values, not scaled.", True)
    decoded = inputs.decode_ring_sum(value, len(given), got.numel())
    if decoded is not None:
        ranks, position = decoded
        missing = sorted(set(range(len(given))) - ranks)
        return (f". Element {wrong} holds the sum of rank(s) {sorted(ranks)}"
                + (f" (rank(s) {missing} never added)" if missing else "")
                + (f" of element {position}: a chunk landed in the wrong place" if position != wrong else "")
                + ".", False)
    return (f". Element {wrong} holds {value:g}, which is no sum of the ranks' inputs (expected {want:g}): a ring "
            "only adds received chunks and copies them, so something else changed this value.", False)


@register("ddp_buckets", nproc=2, summary="after each backward every gradient is the average over ranks, "
          "with one all-reduce per bucket (not per parameter) carrying every gradient byte once; the buckets "
          "leave with async_op=True, the first before backward has produced the last gradient",
          deadlock_hint="Likely: the ranks launch their buckets' all-reduces in different orders or numbers — "
          "every rank must all-reduce the same buckets in the same order.")
def ddp_buckets(me: int, n: int, observed: Reader) -> list[str]:
    reference = inputs.toy_model()
    params = list(reference.parameters())
    buckets = len(plan_buckets(params, inputs.DDP_CAP_BYTES))
    total = sum(p.numel() * p.element_size() for p in params)
    for it, seen in enumerate(observed.items(inputs.DDP_BACKWARDS)):
        with torch.enable_grad():  # the learner's kernel may have turned autograd off
            local = [torch.autograd.grad(F.mse_loss(reference(x), y), params)
                     for x, y in (inputs.ddp_batch(it, r) for r in range(n))]
        for i, got in enumerate(g.tensor() for g in seen["grads"].items(len(params))):
            expected = torch.stack([grads[i] for grads in local]).mean(0)  # the gradient of the mean loss
            problem = differ(f"backward {it + 1}, gradient of parameter {i}", expected, got)
            if problem:
                r = ratio_of(expected, got)
                if r is not None and abs(r - n) < 1e-3:
                    problem += f". Missing average: divide the summed bucket by the world size {n}."
                elif isinstance(got, torch.Tensor) and differ("", local[me][i], got) is None:
                    problem += (". That is this rank's local gradient: the bucket was never all-reduced, or the "
                                "reduced values were not copied back into .grad.")
                return [problem]
        calls = seen["ops"].counts().get("all_reduce", 0)
        if calls != buckets:
            return [f"backward {it + 1}: {calls} all-reduce call(s); with a {inputs.DDP_CAP_BYTES}-byte cap the "
                    f"{len(params)} parameters make {buckets} buckets, one all-reduce each"
                    + (" — one per parameter is what buckets avoid" if calls == len(params) else "")]
        payload = seen["bytes"].counts().get("all_reduce", 0)
        if payload != total:
            return [f"backward {it + 1}: the all-reduces carried {payload} bytes; every gradient byte once is {total}"]
        launched, asynchronous = seen["launched_at"].numbers(), seen["async"].flags()
        if len(launched) != len(params) or launched[-1] < 1:
            return [f"backward {it + 1}: no bucket's all-reduce had left when the last gradient was produced — "
                    "launch each bucket from its hook as soon as it is full, so it travels while backward goes on"]
        if not all(asynchronous):
            return [f"backward {it + 1}: {asynchronous.count(False)} of {len(asynchronous)} all-reduce(s) blocked "
                    "inside the hook, stalling backward: pass async_op=True and wait on the handles once "
                    "backward ends (torch.autograd.Variable._execution_engine.queue_callback)"]
    return []


@register("zero1_step", nproc=2, summary="3 steps equal unsharded SGD-momentum on the averaged gradient, each "
          "rank holds and updates only its 1/n of the optimizer state, and a step sends 2(n−1)/n·S bytes "
          "(what plain data parallelism sends) by reduce-scatter and all-gather",
          deadlock_hint="Likely: one rank skips a collective (e.g. only the owner all-gathers) — reduce-scatter "
          "and all-gather are called by every rank.")
def zero1_step(me: int, n: int, observed: Reader) -> list[str]:
    numel, lr, beta = inputs.ZERO1_NUMEL, inputs.ZERO1_LR, inputs.ZERO1_BETA
    bounds = chunk_bounds(numel, n)
    expected_param = inputs.zero1_start()
    expected_m = [torch.zeros(e - s) for s, e in bounds]  # every rank's state: plain SGD-momentum, sharded
    for step, seen in enumerate(observed.items(inputs.ZERO1_STEPS)):
        avg = torch.stack([inputs.zero1_grad(step, r) for r in range(n)]).mean(0)
        for r, (s, e) in enumerate(bounds):
            expected_m[r].mul_(beta).add_(avg[s:e])
            expected_param[s:e] -= lr * expected_m[r]
        momentum = seen["momentum"].tensor()
        problem = differ(f"step {step + 1}, momentum shard of rank {me} (entries {bounds[me]})", expected_m[me],
                         momentum)
        if problem:
            r = ratio_of(expected_m[me], momentum)
            other = [k for k in range(n) if k != me and differ("", expected_m[k], momentum) is None]
            hint = (f" Missing average: divide the reduced gradient by {n}." if r and abs(r - n) < 1e-3 else
                    f" That is rank {other[0]}'s shard: rank r owns entries [r·P/n, (r+1)·P/n)." if other else "")
            return [problem + hint]
        param = seen["param"].tensor()
        problem = differ(f"step {step + 1}, parameters after the step", expected_param, param)
        if problem:
            if not (isinstance(param, torch.Tensor) and param.shape == expected_param.shape):
                return [problem]
            bad = [k for k, (s, e) in enumerate(bounds) if differ("", expected_param[s:e], param[s:e])]
            return [problem + f". Wrong entries belong to rank(s) {bad}'s shard: after updating its own "
                    "shard each rank must all-gather the others' updated shards."]
        want, sent = 2 * (n - 1) * numel * 4 // n, seen["sent"].count()
        if sent != want:
            return [f"step {step + 1}: sent {sent} bytes; ZeRO-1 sends {want} = 2(n−1)/n·S (reduce-scatter the "
                    "gradients, all-gather the parameters)"
                    + (" — an all-reduce of the gradients sends twice what reduce-scatter does: each rank needs "
                       "only its shard" if sent > want else "")]
        kinds = set(seen["ops"].counts())
        scattered = kinds & {"reduce_scatter_tensor", "reduce_scatter"}
        gathered = kinds & {"all_gather_into_tensor", "all_gather"}
        if not (scattered and gathered) or "all_reduce" in kinds:
            return [f"step {step + 1}: you called {sorted(kinds)}; ZeRO-1 reduce-scatters the gradients (each rank "
                    "needs only its shard's sum) and all-gathers the updated parameters — an all-reduce means "
                    "some rank computed on entries it does not own"]
    return []


FG_HINTS = {"f forward": "f's forward is the identity: every rank already holds the whole X. An all-reduce "
                         "here is g's forward — f and g are swapped?",
            "f backward": "f's backward all-reduces dL/dX: every rank's column slice used all of X, so the "
                          "gradient is the sum of every rank's contribution",
            "g forward": "g's forward all-reduces: the row-parallel partial products sum to Y",
            "g backward": "g's backward is the identity: each partial product fed Y with weight 1. An "
                          "all-reduce here is f's backward — f and g are swapped?"}


@register("tp_f_g", nproc=2, arity=4, summary="f is identity forward / all-reduce backward and g is all-reduce "
          "forward / identity backward (Megatron's conjugate pair), one all-reduce each")
def tp_f_g(me: int, n: int, observed: Reader) -> list[str]:
    x = inputs.fg_input(me)
    summed = torch.stack([inputs.fg_input(r) for r in range(n)]).sum(0)
    for what, seen in zip(inputs.FG_NAMES, observed.items(len(inputs.FG_NAMES))):
        reduces = what in ("f backward", "g forward")
        problem = differ(what, summed if reduces else x, seen["out"].tensor())
        if problem:
            return [f"{problem}. Hint: {FG_HINTS[what]}"]
        ops, calls, want = seen["ops"].counts(), seen["calls"].count(), int(reduces)
        if ops.get("all_reduce", 0) != want or calls != want:
            return [f"{what}: made {calls} collective call(s) {ops}; expected {want} all-reduce"]
    return []


@register("tp_mlp", nproc=2, summary="the column→row parallel MLP equals the full MLP in output and in every "
          "gradient (dL/dX and each weight shard), with one all-reduce forward and one backward",
          deadlock_hint="Likely: a rank skips f or g, or calls a collective the other rank does not.")
def tp_mlp(me: int, n: int, observed: Reader) -> list[str]:
    fc, proj, x = inputs.mlp_layers()
    x.requires_grad_()
    with torch.enable_grad():
        y_full = proj(F.gelu(fc(x)))
        (y_full * inputs.loss_weights(y_full)).sum().backward()
    y_full, bias = y_full.detach(), proj.bias.detach()
    y = observed["y"].tensor()
    problem = differ("output Y", y_full, y)
    if problem:
        r = ratio_of(y_full - bias, y - bias) if isinstance(y, torch.Tensor) and y.shape == y_full.shape else None
        return [problem + (". Hint: Y = g(GeLU(f(X)·W1ᵀ + b1)·W2ᵀ) + b2 — the bias b2 is added once, after g"
                           if r is None else f". Off by {r:.3g}×: is a sum missing or doubled?")]
    cols = inputs.mlp_columns(me, n)
    expected = [("dL/dX", x.grad, "f must wrap X so its backward sums every rank's dL/dX"),
                ("dL/dW1 (your column shard)", fc.weight.grad[cols], "W1 is split by output rows"),
                ("dL/db1", fc.bias.grad[cols], "b1 is split like W1's rows"),
                ("dL/dW2 (your row shard)", proj.weight.grad[:, cols], "W2 is split by input columns"),
                ("dL/db2", proj.bias.grad, "add b2 after g, once")]
    for (what, want, hint), got in zip(expected, observed["grads"].items(len(expected))):
        problem = differ(what, want, got.tensor())
        if problem:
            return [f"{problem}. Hint: {hint}"]
    forward_calls, calls = observed["forward_calls"].count(), observed["ops"].counts().get("all_reduce", 0)
    if (forward_calls, calls) != (1, 2):
        return [f"{forward_calls} collective(s) in forward and {calls} all-reduces in all; a Megatron MLP makes "
                "exactly one in forward (g) and one in backward (f)"]
    return []
