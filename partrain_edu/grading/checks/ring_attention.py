"""Exercise 12, ring attention (context parallelism, 上下文并行; Liu et al. 2023, "Ring Attention with Blockwise
Transformers"): the sequence is cut into n blocks, rank r holds rows [r·S/n, (r+1)·S/n) of Q, K and V, and the
K/V blocks travel around the ring while each rank merges the blocks' partial softmaxes with a running max and
log-sum-exp (the online softmax of Milakov & Gimelshein 2018, as in FlashAttention, Dao et al. 2022).

Graded on 3 ranks (odd: next ≠ previous), S = 12, 2 heads, head dim 4, non-causal and causal: the output
and dQ, dK, dV of each rank's rows equal full softmax attention, recomputed here in float64 (loss Σ out·w with
fixed weights w), and the resource: forward, each rank sends K and V blocks n−1 times, point-to-point to one
ring neighbour only,
    bytes sent per rank = (n−1)·(bytes of its K block + V block) = (n−1)/n · (bytes of the whole K and V),
and backward the same bytes of dK, dV the other way (the given `pass_to_next`). Sending n times, or an
all-gather of K and V (same bytes, but every rank then holds the whole sequence), fails with the reason.
"""
from __future__ import annotations

import math

import torch

from partrain_edu.comm import CommTracer
from partrain_edu.grading.compare import differ
from partrain_edu.grading.givens.ring_attention import pass_to_next
from partrain_edu.grading.observations import Reader, tensor, traffic
from partrain_edu.grading.registry import register

NPROC, HEADS, SEQ, DIM = 3, 2, 12, 4
ROWS = SEQ // NPROC                       # positions per rank
BLOCK_BYTES = HEADS * ROWS * DIM * 4      # one rank's K (or V) block in float32
MODES = (False, True)                     # causal
P2P = {"isend", "irecv", "send", "recv"}
TOL = {"rtol": 1e-4, "atol": 1e-5}        # float32 ring vs float64 reference: the solution stays under 1/50 of it


def full_qkv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q, K, V of the whole sequence, (heads, S, head dim). Q is scaled up so each query's softmax mass is
    spread very unevenly over the three blocks: averaging the blocks instead of weighting them shows."""
    gen = torch.Generator().manual_seed(12)
    return 2 * torch.randn(HEADS, SEQ, DIM, generator=gen), torch.randn(HEADS, SEQ, DIM, generator=gen), \
        torch.randn(HEADS, SEQ, DIM, generator=gen)


def rows(rank: int) -> slice:
    return slice(rank * ROWS, (rank + 1) * ROWS)


def loss_weights() -> torch.Tensor:
    """L = Σ out·w with fixed distinct weights over the whole output: every element gets its own gradient."""
    return torch.arange(HEADS * SEQ * DIM, dtype=torch.float32).reshape(HEADS, SEQ, DIM).sin()


def observe(ctx, ring_attention, *, seed: int) -> list[dict]:
    runs = []
    for causal in MODES:
        q, k, v = (t[:, rows(ctx.rank)].clone().requires_grad_() for t in full_qkv())
        with CommTracer() as forward:
            out = ring_attention(q, k, v, group=None, causal=causal)
        with CommTracer() as backward:  # the same shape on every rank, so all ranks backward or none does
            if isinstance(out, torch.Tensor) and out.requires_grad and out.shape == q.shape:
                (out * loss_weights()[:, rows(ctx.rank)]).sum().backward()
        runs.append({"out": tensor(out), "grads": [tensor(t.grad) for t in (q, k, v)],
                     "forward": traffic(forward), "backward": traffic(backward)})
    return runs


# --- the trusted half: everything recomputed here, in float64 -------------------------------------------------

def attention(q, k, v, masked: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ/√d)·v over the whole sequence; `masked` (S×S, True = hidden) hides keys from queries."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if masked is not None:
        scores = scores.masked_fill(masked, -math.inf)
    return scores.softmax(-1) @ v


def position_masks() -> dict[str, torch.Tensor]:
    pos = torch.arange(SEQ)
    block, local = pos // ROWS, pos % ROWS
    return {"causal": pos[None, :] > pos[:, None],                     # key after query
            "local": local[None, :] > local[:, None],                  # the diagonal mask in every block
            "own": block[None, :] != block[:, None]}                   # keys of other ranks' blocks


def merged_wrongly(q, k, v, me: int, causal: bool, how: str) -> torch.Tensor:
    """Rank `me`'s output when the per-block softmaxes (blocks in ring order: own first) are merged `how`:
    "average" (each block's softmax·V averaged) or "no rescale" (a running max, but the old sum and output
    never multiplied by exp(m_old − m_new))."""
    qr, hide = q[:, rows(me)], position_masks()["causal"][rows(me)]
    outs, m, l, acc = [], torch.full((HEADS, ROWS, 1), -math.inf, dtype=q.dtype), 0, 0
    for step in range(NPROC):
        j = (me - step) % NPROC
        scores = qr @ k[:, rows(j)].transpose(-2, -1) / math.sqrt(DIM)
        if causal:
            if j > me:
                continue
            scores = scores.masked_fill(hide[:, rows(j)], -math.inf)
        outs.append(scores.softmax(-1) @ v[:, rows(j)])
        m = torch.maximum(m, scores.amax(-1, keepdim=True))
        p = torch.exp(scores - m)
        l, acc = l + p.sum(-1, keepdim=True), acc + p @ v[:, rows(j)]
    return torch.stack(outs).mean(0) if how == "average" else acc / l


def block_masses(q, k, me: int, causal: bool, head: int, row: int) -> list[float]:
    """How much of query (head, me's row `row`)'s softmax mass falls on each rank's K block."""
    scores = q[head, me * ROWS + row] @ k[head].T / math.sqrt(DIM)
    if causal:
        scores = scores.masked_fill(position_masks()["causal"][me * ROWS + row], -math.inf)
    return [float(w) for w in scores.softmax(-1).reshape(NPROC, ROWS).sum(-1)]


def first_wrong(expected: torch.Tensor, got: torch.Tensor) -> tuple[int, int]:
    bad = (~torch.isclose(got.double(), expected, **TOL)).any(-1).nonzero()
    return int(bad[0][0]), int(bad[0][1])


def output_hint(q, k, v, me: int, causal: bool, got) -> str:
    """What the rank's wrong output is, recognised among the likely mistakes."""
    if not isinstance(got, torch.Tensor) or got.shape != (HEADS, ROWS, DIM):
        return f". Return a tensor shaped like q: ({HEADS}, {ROWS}, {DIM}) = (heads, rows of this rank, head dim)"
    masks = position_masks()
    same = lambda candidate: differ("", candidate, got, **TOL) is None  # noqa: E731
    head, row = first_wrong(attention(q, k, v, masks["causal"] if causal else None)[:, rows(me)], got)
    where = f" (first at head {head}, query {row} of rank {me} = global position {me * ROWS + row})"
    if same(merged_wrongly(q, k, v, me, causal, "average")):
        masses = ", ".join(f"{w:.2f}" for w in block_masses(q, k, me, causal, head, row))
        return (f"{where}: your blocks were averaged, not weighted by their softmax mass — this query puts "
                f"{masses} of its mass on the K/V blocks of ranks 0..{NPROC - 1}, an average gives each the same. "
                "Merge with log-sum-exp: keep a running max m and sum l per query, rescale the old l and output by "
                "exp(m_old − m_new), divide by l at the end")
    if same(merged_wrongly(q, k, v, me, causal, "no rescale")):
        return (f"{where}: when a block raises the running max, the sum l and output so far must be multiplied by "
                "exp(m_old − m_new) — you kept adding terms measured against different maxima")
    if same(attention(q, k, v, masks["own"] | masks["causal"] if causal else masks["own"])[:, rows(me)]):
        return f"{where}: that is attention over your own block only — pass K and V around the ring, n−1 times"
    if causal and same(attention(q, k, v)[:, rows(me)]):
        return f"{where}: that is non-causal attention — with causal=True hide every key after its query"
    if causal and same(attention(q, k, v, masks["local"])[:, rows(me)]):
        return (f"{where}: you masked by positions within the block; mask by global position: query i of rank r "
                f"is at r·{ROWS} + i, and the block you hold at step s came from rank (r − s) mod n")
    return where + (". Hint: a key at global position j is visible to query i iff j ≤ i" if causal else
                    ". Hint: scores are q·kᵀ/√d; merge the blocks with a running max and log-sum-exp")


def traffic_problem(seen: Reader, me: int, n: int, what: str, blocks: str) -> str | None:
    """None if `seen` (a traffic record) is a ring's: only point-to-point, to one neighbour and from the other,
    (n−1)·(K block + V block) bytes sent."""
    ops = seen["ops"].counts()
    used = sorted(set(ops) - P2P)
    whole = 2 * n * BLOCK_BYTES
    if used:
        if not any(op.startswith("all_gather") for op in used):
            return (f"{what}: you called {used}; ring attention moves K and V (and their gradients) point-to-point "
                    "only, one block per step to the next rank: pass them with pass_to_next")
        return (f"{what}: you called {used}. An all-gather sends the same (n−1)/n of K and V, but then every rank "
                f"holds the whole sequence's K and V ({whole} B, not the {2 * BLOCK_BYTES} B of the block a ring "
                f"step works on) and scores its queries against all {SEQ} keys at once — the memory that grows with "
                "the sequence, which context parallelism exists to avoid. Pass one block at a time with pass_to_next")
    peers = {op: set(seen["peers"][op].numbers()) for op in seen["peers"].keys()}
    to = peers.get("isend", set()) | peers.get("send", set())
    heard = peers.get("irecv", set()) | peers.get("recv", set())
    ring = [({(me + 1) % n}, {(me - 1) % n}), ({(me - 1) % n}, {(me + 1) % n})]  # either direction is a ring
    if (to, heard) not in ring:
        return (f"{what}: rank {me} sent to rank(s) {sorted(to)} and received from {sorted(heard)}; in a ring each "
                f"rank sends to one neighbour only and receives from the other ({(me + 1) % n} and {(me - 1) % n})")
    want, sent = (n - 1) * 2 * BLOCK_BYTES, seen["sent"].count()
    if sent != want:
        pair = 2 * BLOCK_BYTES
        times = f"{sent // pair} times" if sent % pair == 0 else "a different amount"
        return (f"{what}: rank {me} sent {sent} B; the ring sends {blocks} n−1 = {n - 1} times: "
                f"(n−1)·({BLOCK_BYTES} + {BLOCK_BYTES}) = {want} B = (n−1)/n of the whole K and V ({whole} B). You "
                f"sent them {times}" + (" — the n-th pass only brings your own block back: pass n−1 times"
                                        if sent == n * 2 * BLOCK_BYTES else ""))
    return None


GRAD_HINTS = ("dQ flows through your own forward ops: build the output with torch ops only — no .detach() of the "
              "scores or probabilities, no in-place edits of tensors autograd saved",
              "other ranks' queries also attend to your K block: their dK comes back only through pass_to_next's "
              "backward — pass K with it, not with a bare isend/irecv or all_gather",
              "other ranks' queries also read your V block: their dV comes back only through pass_to_next's "
              "backward — pass V with it, not with a bare isend/irecv or all_gather")


@register("ring_attention", nproc=NPROC, observe=observe, given={"pass_to_next": pass_to_next},
          summary=f"output, dQ, dK and dV equal full softmax attention on "
          f"{NPROC} ranks ({SEQ} positions, {HEADS} heads), non-causal and causal, and each rank sent its K and V "
          f"blocks n−1 times to one ring neighbour only — (n−1)/n of K and V, {(NPROC - 1) * 2 * BLOCK_BYTES} B — "
          "and the same bytes of dK, dV back",
          deadlock_hint="Likely: the ranks called pass_to_next different numbers of times, or a rank skipped a "
          "block it received (causal: a block from a later rank), so that pass's output never reached the loss and its "
          "backward — which sends the gradient back — never ran there. Keep every block in the computation, fully "
          "masked, and pass on every rank alike.")
def verify(me: int, n: int, observed: Reader, *, seed: int) -> list[str]:
    q, k, v = (t.double().requires_grad_() for t in full_qkv())
    for causal, seen in zip(MODES, observed.items(len(MODES))):
        mode = "causal" if causal else "non-causal"
        for t in (q, k, v):
            t.grad = None
        with torch.enable_grad():  # the learner's kernel may have turned autograd off
            out = attention(q, k, v, position_masks()["causal"] if causal else None)
            (out * loss_weights().double()).sum().backward()
        got = seen["out"].tensor()
        problem = differ(f"{mode}, output of rank {me}", out.detach()[:, rows(me)], got, **TOL)
        if problem:
            return [problem + output_hint(q.detach(), k.detach(), v.detach(), me, causal, got)]
        problem = traffic_problem(seen["forward"], me, n, f"{mode}, forward", "its K and V blocks")
        if problem:
            return [problem]
        grads = seen["grads"].items(3)
        for name, t, grad, hint in zip(("dQ", "dK", "dV"), (q, k, v), grads, GRAD_HINTS):
            problem = differ(f"{mode}, {name} of rank {me}'s rows", t.grad[:, rows(me)], grad.tensor(), **TOL)
            if problem:
                return [f"{problem}. Hint: {hint}"]
        problem = traffic_problem(seen["backward"], me, n, f"{mode}, backward", "the gradients of K and V")
        if problem:
            return [problem]
    return []
