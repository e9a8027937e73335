"""Exercise 12, ring attention on 4 ranks (the default group and the group [1, 2, 3]), configurations drawn from a
seed. On ranks, one torchrun launch each: the solution passes for two seeds; blocks averaged instead of merged with
log-sum-exp, a running max without rescaling, K/V sent n times, an all-gather of K and V (right values, wrong
traffic), the causal mask built for the wrong block owner (rank 1's output is named, before the dK it spoils on
rank 0), fully masked blocks skipped (told, not a hang), `group` left out of pass_to_next or of the rank and size,
q changed in place, K and V passed detached, and an answer hard-coded to 3 ranks each fail with a message naming
the earliest wrong quantity (an error raised in a later configuration, as the all-gather's backward on the group,
does not hide it); a table of the outputs of three seeds' configurations fails on a fourth. In-process,
the verify half accepts observations made with torch's own scaled_dot_product_attention and the ring's traffic
formula, names a causal flag that was ignored, and tells a rank's wrong output before another rank's wrong
gradient."""
import json

import pytest
import torch
import torch.nn.functional as F

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.checks import ring_attention as ra
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import tensor, verify
from partrain_edu.grading.runner import spec_of

NAME, SEED = "ring_attention", 11
SOLUTION = solution_source("12_ring_attention", "ring_attention")
MERGE = ("        l = l * rescale + p.sum(-1, keepdim=True)\n"
         "        acc = acc * rescale + p @ v\n")
PASS = "            k, v = pass_to_next(k, group), pass_to_next(v, group)"
SCORES = "        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])\n"
SKIP = ("        if causal and source > me:  # a later rank's block: all in the future\n"
        "            if step < n - 1:\n"
        "                k, v = pass_to_next(k, group), pass_to_next(v, group)\n"
        "            continue\n")
ALL_GATHER = '''
def ring_attention(q, k, v, group=None, causal=False):
    # every rank gathers the whole sequence's K and V (differentiably): right values, not a ring
    from torch.distributed.nn.functional import all_gather
    rows = q.shape[-2]
    k_all, v_all = torch.cat(all_gather(k, group), -2), torch.cat(all_gather(v, group), -2)
    scores = q @ k_all.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        queries = dist.get_rank(group) * rows + torch.arange(rows)
        scores = scores.masked_fill(torch.arange(k_all.shape[-2])[None, :] > queries[:, None], -math.inf)
    return scores.softmax(-1) @ v_all
'''


@pytest.mark.parametrize("seed", [1, 2])
def test_the_solution_passes(seed):
    result = run_check(NAME, SOLUTION, seed=seed)
    assert result.passed, result.message


@pytest.mark.parametrize("source, words", [
    (variant(SOLUTION, MERGE, "        l = torch.ones_like(l)  # each block's own softmax, averaged\n"
                              "        acc = acc + (p / p.sum(-1, keepdim=True)) @ v / n\n"),
     ["rank 0 ", "default group of 4, non-causal", "output of rank 0", "averaged, not weighted by their softmax mass",
      "log-sum-exp"]),
    (variant(SOLUTION, "rescale = torch.exp(m - m_new)", "rescale = 1"),
     ["default group of 4, non-causal", "output of rank", "multiplied by exp(m_old − m_new)"]),
    (variant(SOLUTION, "if step < n - 1:", "if step < n:"),
     ["default group of 4, non-causal", "forward: rank 0 sent 672 B", "(n−1)/n of the whole K and V (672 B)",
      "4 times", "pass n−1 times"]),
    (Source(NAME, ALL_GATHER),  # its backward raises on the group [1, 2, 3] (torch's own); told after this
     ["default group of 4, non-causal", "forward: you called ['all_gather']", "holds the whole sequence's K and V",
      "pass_to_next"]),
    (variant(SOLUTION, "source = (me - step) % n", "source = (me + step) % n"),  # the owner in the mask
     ["rank 1 ", "default group of 4, causal", "output of rank 1", "for rank (r + s) mod n's",
      "came from rank (r − s) mod n"]),
    (variant(SOLUTION, SCORES, SKIP + SCORES),
     ["rank 0 ", "default group of 4, causal", "6 of your 6 pass_to_next calls", "never reach your output",
      "wait forever", "keep every block in the computation, fully masked"]),
    (variant(SOLUTION, PASS, "            k, v = pass_to_next(k), pass_to_next(v)"),
     ["raised ValueError: pass_to_next(tensor, group=None) while ring_attention was handed the group of global "
      "ranks [1, 2, 3]", "pass the function's own `group` on"]),
    (variant(SOLUTION, "dist.get_world_size(group), dist.get_rank(group)", "dist.get_world_size(), dist.get_rank()"),
     ["rank 1 ", "group [1, 2, 3], non-causal", "output of rank 1", "a ring of the world's 4 ranks",
      "dist.get_rank(group) = 0, dist.get_world_size(group) = 3"]),
    (variant(SOLUTION, "    rows = q.shape[-2]\n", "    rows = q.shape[-2]\n    q.data.div_(math.sqrt(q.shape[-1]))\n")
     .text.replace(SCORES, "        scores = q @ k.transpose(-2, -1)\n"),
     ["default group of 4, non-causal", "rank 0's q after your call", "changed its input q"]),
    (variant(SOLUTION, PASS, "            k, v = pass_to_next(k.detach(), group), pass_to_next(v.detach(), group)"),
     ["default group of 4, non-causal", "dK of rank", "the share of your own queries alone",
      "pass K with pass_to_next"]),
    (variant(SOLUTION, "n, me = dist.get_world_size(group), dist.get_rank(group)", "n, me = 3, dist.get_rank(group)"),
     ["default group of 4, non-causal", "output of rank"]),  # an answer hard-coded to the old check's 3 ranks
], ids=["blocks-averaged", "no-rescale", "sent-n-times", "all-gather", "wrong-owner", "skips-masked-blocks",
        "group-not-passed", "world-rank-and-size", "changes-q", "detached-pass", "hard-coded-3-ranks"])
def test_a_wrong_answer_is_caught_naming_the_mistake(source, words):
    source = source if isinstance(source, Source) else Source(NAME, source)
    result = run_check(NAME, source, timeout=60, seed=SEED)
    assert not result.passed
    assert "timed out" not in result.message, result.message
    for word in words:
        assert word in result.message, (word, result.message)


def expected_outputs(seed: int) -> dict:
    """{(global rank, q's shape, q's first value): that rank's expected output} for every configuration of `seed`:
    more than any failure message prints (one rank's first wrong quantity, eight values of it)."""
    table = {}
    for cfg in ra.configs(seed):
        q, out = ra.tensors(cfg)[0], ra.reference(cfg)["out"]
        for g, rank in enumerate(cfg.members):
            mine = cfg.block(g)
            key = (rank, tuple(q[:, mine].shape), round(float(q[0, mine.start, 0]), 5))
            table[key] = out[:, mine].reshape(-1).tolist()
    return table


def test_a_table_of_three_runs_outputs_fails_on_a_fourth():
    table = {}
    for seed in (101, 102, 103):
        table.update(expected_outputs(seed))
    assert not set(table) & set(expected_outputs(104))  # a fresh run's configurations are others
    replay = Source(NAME, f'''def ring_attention(q, k, v, group=None, causal=False):
    table = {table!r}
    key = (dist.get_rank(), tuple(q.shape), round(float(q[0, 0, 0]), 5))
    if key in table:
        return torch.tensor(table[key], dtype=q.dtype).reshape(q.shape) + 0 * q
    return torch.zeros_like(q) + 0 * q
''')
    result = run_check(NAME, replay, seed=104)
    assert not result.passed and "default group of 4, non-causal" in result.message, result.message
    assert "output of rank 0: " in result.message and "got 0;" in result.message


# --- the verify half alone, on observations made in-process (no ranks) -------------------------------------------

def observations(seed: int, causal_output=None, spoil=None) -> str:
    """Every rank's observations for the configurations of `seed`, as the observe half writes them, with outputs
    and gradients from torch's scaled_dot_product_attention (the causal runs' output from `causal_output(q, k, v)`
    if given) and a ring's traffic; `spoil(config index, global rank, run)` may change a run."""
    ranks = [[] for _ in range(ra.WORLD)]
    for c, cfg in enumerate(ra.configs(seed)):
        q, k, v, w = (t.clone().requires_grad_() for t in ra.tensors(cfg))
        out = causal_output(q, k, v) if cfg.causal and causal_output else \
            F.scaled_dot_product_attention(q, k, v, is_causal=cfg.causal)
        (out * w).sum().backward()
        size, block = len(cfg.members), cfg.heads * cfg.rows * cfg.dim * 4
        for rank in range(ra.WORLD):
            if rank not in cfg.members:
                ranks[rank].append({})
                continue
            g = cfg.members.index(rank)
            mine, ahead, behind = cfg.block(g), cfg.members[(g + 1) % size], cfg.members[(g - 1) % size]

            def ring(to, heard, size=size, block=block):
                calls = 2 * (size - 1)
                return {"ops": {"isend": calls, "irecv": calls}, "sent": calls * block,
                        "bytes": {"isend": calls * block, "irecv": calls * block},
                        "peers": {"isend": [to], "irecv": [heard]}}
            run = {"out": tensor(out[:, mine]), "inputs": [tensor(t.detach()[:, mine]) for t in (q, k, v)],
                   "passes": 2 * (size - 1), "unused": [], "backward_ran": True, "raised": None,
                   "grads": [tensor(t.grad[:, mine]) for t in (q, k, v)],
                   "forward": ring(ahead, behind), "backward": ring(behind, ahead)}
            if spoil:
                spoil(c, rank, run)
            ranks[rank].append(run)
    return json.dumps(ranks)


def test_verify_accepts_torch_attention_and_the_ring_traffic():
    for seed in (1, 2, 3):
        assert verify(spec_of(NAME, 1), observations(seed), seed) == []


def test_verify_names_a_causal_flag_that_was_ignored():
    problems = verify(spec_of(NAME, 1), observations(SEED, F.scaled_dot_product_attention), SEED)
    assert problems and "default group of 4, causal" in problems[0] and "output of rank" in problems[0], problems
    assert "that is non-causal attention" in problems[0] and "hide every key after its query" in problems[0]


def test_a_wrong_output_on_a_later_rank_is_told_before_the_wrong_gradient_it_causes_on_rank_0():
    def spoil(c, rank, run):
        if c == 1 and rank == 0:    # rank 0's dK is off (in the backward) ...
            run["grads"][1] = tensor(torch.zeros(torch.Size(run["grads"][1]["shape"])))
        if c == 1 and rank == 2:    # ... because rank 2's output was off first (in the forward)
            run["out"] = tensor(torch.tensor(run["out"]["values"]).reshape(run["out"]["shape"]) + 1)

    problems = verify(spec_of(NAME, 1), observations(SEED, spoil=spoil), SEED)
    assert problems and problems[0].startswith("rank 2 (rank(s) [0] failed this check too): default group of 4, "
                                               "causal"), problems
    assert "output of rank 2" in problems[0]
