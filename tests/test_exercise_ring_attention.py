"""Exercise 12, ring attention on 3 ranks (the solution is graded in test_exercises): blocks averaged instead of
merged with log-sum-exp, a running max without rescaling, K/V sent n times, and an all-gather of K and V (right
values, wrong traffic) each fail with a message naming the mistake (one torchrun launch each). In-process, the
verify half accepts observations made with torch's own scaled_dot_product_attention and the ring's traffic
formula, and names a causal flag that was ignored."""
import json

import pytest
import torch.nn.functional as F

from exercise_sources import solution_source, variant

from partrain_edu.grading import run_check
from partrain_edu.grading.checks import ring_attention as ra
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import tensor, verify
from partrain_edu.grading.runner import spec_of

SOLUTION = solution_source("12_ring_attention", "ring_attention")
MERGE = ("        l = l * rescale + p.sum(-1, keepdim=True)\n"
         "        acc = acc * rescale + p @ v\n")
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


@pytest.mark.parametrize("source, words", [
    (variant(SOLUTION, MERGE, "        l = torch.ones_like(l)  # each block's own softmax, averaged\n"
                              "        acc = acc + (p / p.sum(-1, keepdim=True)) @ v / n\n"),
     ["non-causal, output of rank", "averaged, not weighted by their softmax mass", "log-sum-exp"]),
    (variant(SOLUTION, "rescale = torch.exp(m - m_new)", "rescale = 1"),
     ["non-causal, output of rank", "multiplied by exp(m_old − m_new)"]),
    (variant(SOLUTION, "if step < n - 1:", "if step < n:"),
     ["non-causal, forward", "sent 768 B", "(n−1)/n of the whole K and V (768 B)", "3 times", "pass n−1 times"]),
    (Source("ring_attention", ALL_GATHER),
     ["non-causal, forward", "you called ['all_gather']", "holds the whole sequence's K and V", "pass_to_next"]),
], ids=["blocks-averaged", "no-rescale", "sent-n-times", "all-gather"])
def test_a_wrong_answer_is_caught_naming_the_mistake(source, words):
    result = run_check("ring_attention", source, timeout=120)
    assert not result.passed
    for word in words:
        assert word in result.message, (word, result.message)


# --- the verify half alone, on observations made in-process (no ranks) -------------------------------------

def observations(causal_output) -> str:
    """Every rank's observations as the observe half writes them, with outputs and gradients from torch's
    scaled_dot_product_attention and the traffic of a ring; `causal_output(q, k, v)` is the causal run's output."""
    block = ra.BLOCK_BYTES

    def ring(me, forward):
        to, heard = ((me + 1) % 3, (me - 1) % 3) if forward else ((me - 1) % 3, (me + 1) % 3)
        return {"ops": {"isend": 4, "irecv": 4}, "sent": 4 * block, "bytes": {"isend": 4 * block, "irecv": 4 * block},
                "peers": {"isend": [to], "irecv": [heard]}}

    ranks = [[] for _ in range(3)]
    for causal in ra.MODES:
        q, k, v = (t.clone().requires_grad_() for t in ra.full_qkv())
        out = causal_output(q, k, v) if causal else F.scaled_dot_product_attention(q, k, v)
        (out * ra.loss_weights()).sum().backward()
        for me in range(3):
            mine = ra.rows(me)
            ranks[me].append({"out": tensor(out[:, mine]), "grads": [tensor(t.grad[:, mine]) for t in (q, k, v)],
                              "forward": ring(me, True), "backward": ring(me, False)})
    return json.dumps(ranks)


def test_verify_accepts_torch_attention_and_the_ring_traffic():
    causal = observations(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert verify(spec_of("ring_attention", 1), causal, 0) == []


def test_verify_names_a_causal_flag_that_was_ignored():
    problems = verify(spec_of("ring_attention", 1), observations(F.scaled_dot_product_attention), 0)
    assert problems and "causal, output of rank" in problems[0], problems
    assert "that is non-causal attention" in problems[0] and "hide every key after its query" in problems[0]
