"""Exercise 13, communication bounds (in-process): the four solution functions pass; wrong answers (the whole
step's FLOPs for DDP, ZeRO-3's bytes all behind backward, a Ψ or token count that does not cancel, no (N−1)/N,
< instead of ≤ at a bound hit exactly, floats, tokens for sequences…) each fail with a message naming the
mistake. The check's closed forms equal a search over degrees priced pass by pass with the ring model of
`theory.traffic`, and the hardware the exercise hands out is `theory`'s."""
import linecache
import math
from fractions import Fraction

import pytest

from exercise_sources import solution_source, variant

from partrain_edu.grading import run_check
from partrain_edu.grading.checks import communication_bounds as cb
from partrain_edu.grading.givens.communication_bounds import BANDWIDTH, MODEL_7_5B, PEAK_FLOPS
from partrain_edu.grading.learner_code import Source
from partrain_edu.theory.hardware import DEVICES
from partrain_edu.theory.planner import assumed_shape
from partrain_edu.theory.traffic import LINKS, ring_bytes_sent

NOTEBOOK = "13_communication_bounds"
FUNCTIONS = ("max_dp_degree", "max_fsdp_degree", "max_tp_degree", "min_dp_batch")  # each graded by its namesake


def learner(source: Source):
    """The learner's function as a notebook cell defines it: beside the setup cell's `math`, its source kept in
    linecache (as IPython keeps a cell's), so the grader reads it as it would in a notebook."""
    filename = f"<learner cell {len(linecache.cache)}: {source.name}>"
    linecache.cache[filename] = (len(source.text), None, source.text.splitlines(True), filename)
    namespace = {"math": math, "__name__": "__main__"}
    exec(compile(source.text, filename, "exec"), namespace)
    return namespace[source.name]


def solution(name: str) -> Source:
    return solution_source(NOTEBOOK, name)


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_solution_passes(function):
    result = run_check(function, learner(solution(function)))
    assert result.passed, result.message


DP_FLOOR = "1 + math.floor(tokens_per_step * bandwidth / peak_flops)"
TP_FLOOR = "1 + math.floor(3 * hidden * bandwidth / peak_flops)"
PER_DEVICE = "math.ceil((degree - 1) * peak_flops / (degree * seq_len * bandwidth))"


@pytest.mark.parametrize("function, old, new, words", [
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(1.5 * tokens_per_step * bandwidth / peak_flops)",
     ["expected 85, got 127", "all-reduce takes 206.4 ms, backward 137.6 ms", "whole step's 6Ψ", "only in backward"]),
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(2 * tokens_per_step * bandwidth / peak_flops)",
     ["expected 85, got 169", "2 bytes per element", "not Ψ"]),
    ("max_dp_degree", DP_FLOOR, "max(1, math.floor(tokens_per_step * bandwidth / peak_flops))",
     ["expected 85, got 84", "(N−1)/N"]),
    ("max_dp_degree", DP_FLOOR, "1 + tokens_per_step * bandwidth / peak_flops",
     ["expected the whole number 85, got 85.0205", "return an int"]),
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(tokens_per_step * bandwidth / peak_flops * (params / 1.3e9) ** 0.1)",
     ["the same with Ψ = 175B: expected 85, got 138", "only Ψ changed (85 → 138)", "cancels"]),
    ("max_dp_degree", DP_FLOOR, "math.ceil(tokens_per_step * bandwidth / peak_flops)",
     ["T = 2^16 tokens", "expected 5, got 4", "exactly as long as compute", "(N−1)·F ≤ T·β"]),
    ("max_fsdp_degree", DP_FLOOR, "1 + math.floor(2 / 3 * tokens_per_step * bandwidth / peak_flops)",
     ["expected 169, got 113", "forward's all-gather", "each pass's collectives"]),
    ("max_fsdp_degree", DP_FLOOR, "1 + math.floor(tokens_per_step * bandwidth / peak_flops / 2)",
     ["expected 169, got 85", "fp32"]),
    ("max_fsdp_degree", DP_FLOOR, "1 + round(tokens_per_step * bandwidth / peak_flops)",
     ["32 × 2048 tokens, H100 over NVLink: expected 30, got 31", "all-gather takes 32.12 ms, forward 31.93 ms",
      "round the bound down"]),
    ("max_tp_degree", TP_FLOOR, "1 + math.floor(4.5 * hidden * bandwidth / peak_flops)",
     ["h = 12288 (GPT-3)", "expected 36, got 54", "whole step", "overlap only the forward"]),
    ("max_tp_degree", TP_FLOOR, "1 + math.floor(2 * hidden * bandwidth / peak_flops)",
     ["expected 36, got 24", "attention's four h×h matmuls"]),
    ("max_tp_degree", TP_FLOOR, "1 + math.floor(3 * hidden * bandwidth / peak_flops * tokens_per_device / 2048)",
     ["8 sequences per micro-batch: expected 36, got 284", "only the tokens changed", "cancels"]),
    ("min_dp_batch", "return degree * max(1, per_device)",
     "return max(1, math.ceil((degree - 1) * peak_flops / (seq_len * bandwidth)))",
     ["expected 72 sequences, got 68", "67.61 sequences", "multiple of N = 8"]),
    ("min_dp_batch", "return degree * max(1, per_device)", "return seq_len * degree * max(1, per_device)",
     ["expected 72 sequences, got 147456", "not tokens"]),
    ("min_dp_batch", PER_DEVICE, PER_DEVICE.replace("ceil", "floor"),
     ["expected 72 sequences, got 64", "round up"]),
    ("min_dp_batch", PER_DEVICE, "math.floor((degree - 1) * peak_flops / (degree * seq_len * bandwidth)) + 1",
     ["s = 2^12", "expected 12 sequences, got 16", "exactly as long as compute", "B·s·β ≥ (N−1)·F"]),
], ids=["dp-whole-step", "dp-psi-bytes", "dp-no-ring-factor", "dp-float", "dp-psi-matters", "dp-ceil-at-tie",
        "fsdp-all-behind-backward", "fsdp-fp32", "fsdp-round", "tp-whole-step", "tp-mlp-only", "tp-tokens-matter",
        "batch-not-a-multiple", "batch-in-tokens", "batch-rounded-down", "batch-strict-at-tie"])
def test_a_wrong_answer_is_caught_naming_the_mistake(function, old, new, words):
    result = run_check(function, learner(variant(solution(function), old, new)))
    assert not result.passed
    for word in words:
        assert word in result.message, (word, result.message)


def test_an_answer_that_imports_the_checks_closed_form_is_refused():
    cheat = Source("max_dp_degree", "def max_dp_degree(params, tokens_per_step, peak_flops, bandwidth):\n"
                   "    from partrain_edu.grading.checks.communication_bounds import dp_slack, largest_degree\n"
                   "    return largest_degree(dp_slack(params, tokens_per_step, peak_flops, bandwidth))\n")
    result = run_check("max_dp_degree", learner(cheat))
    assert not result.passed and "partrain_edu.grading.checks.communication_bounds" in result.message


# --- the closed forms against a search, pass by pass, in exact arithmetic -----------------------------------

def ring(op: str, payload: int, n: int) -> Fraction:
    """Bytes one rank sends, exactly: `theory.traffic.ring_bytes_sent` before it rounds up to whole bytes."""
    sent = Fraction({"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}[op] * (n - 1) * payload, n)
    assert ring_bytes_sent(op, payload, n) == math.ceil(sent)
    return sent


def hides(passes, flops, bandwidth) -> bool:
    """Every pass's collectives (op, payload bytes, group) take no longer than its FLOPs."""
    return all(sum(ring(op, size, n) for op, size, n in sends) / Fraction(bandwidth)
               <= Fraction(work) / Fraction(flops) for sends, work in passes)


def dp_passes(n, psi, tokens):
    return [([("all_reduce", 2 * psi, n)], Fraction(4 * psi * tokens, n))]  # backward only: gradients


def fsdp_passes(n, psi, tokens):
    return [([("all_gather", 2 * psi, n)], Fraction(2 * psi * tokens, n)),                      # forward
            ([("all_gather", 2 * psi, n), ("reduce_scatter", 2 * psi, n)], Fraction(4 * psi * tokens, n))]


def tp_passes(t, hidden, tokens):
    activations = 2 * tokens * hidden
    return [([("all_reduce", activations, t)] * 2, Fraction(24 * tokens * hidden**2, t)),       # forward
            ([("all_reduce", activations, t)] * 2, Fraction(48 * tokens * hidden**2, t))]       # backward


def largest(passes_of, size, tokens, flops, bandwidth) -> int:
    """The last degree before the first that does not hide (1 always does), after which 100 more do not either."""
    n = 1
    while hides(passes_of(n + 1, size, tokens), flops, bandwidth):
        n += 1
    assert not any(hides(passes_of(m, size, tokens), flops, bandwidth) for m in range(n + 1, n + 101))
    return n


@pytest.mark.parametrize("cases, passes_of, closed", [
    (cb.DP_CASES, dp_passes, lambda *a: cb.largest_degree(cb.dp_slack(*a))),
    (cb.FSDP_CASES, fsdp_passes, lambda *a: cb.largest_degree(cb.dp_slack(*a))),
    (cb.TP_CASES, tp_passes, lambda *a: cb.largest_degree(cb.tp_slack(*a))),
], ids=["dp", "fsdp", "tp"])
def test_each_closed_form_is_the_largest_degree_whose_passes_hide_their_collectives(cases, passes_of, closed):
    for label, args in cases:
        assert closed(*args) == largest(passes_of, *args), label


def test_the_smallest_batch_is_the_first_multiple_of_n_whose_all_reduce_hides():
    for label, (n, seq, flops, bandwidth) in cb.BATCH_CASES:
        fits = next(b for b in range(n, 10**6, n) if hides(dp_passes(n, 10**9, b * seq), flops, bandwidth))
        assert cb.min_batch(n, seq, flops, bandwidth) == fits, label


def test_some_case_of_each_check_hits_its_bound_exactly_and_one_answers_1():
    for cases, slack in [(cb.DP_CASES, cb.dp_slack), (cb.FSDP_CASES, cb.dp_slack), (cb.TP_CASES, cb.tp_slack)]:
        assert any(slack(*args).denominator == 1 for _, args in cases)
        assert any(cb.largest_degree(slack(*args)) == 1 for _, args in cases)
    assert any(cb.batch_need(*args).denominator == 1 for _, args in cb.BATCH_CASES)


def test_the_hardware_handed_out_is_the_courses():
    assert PEAK_FLOPS == {name: d.peak_flops for name, d in DEVICES.items()}
    assert BANDWIDTH["h100"] == {"nvlink": LINKS["nvlink"], "infiniband": LINKS["infiniband"],
                                 "8 NICs": 8 * LINKS["infiniband"]}          # 400 GB/s: under NVLink's 450
    assert BANDWIDTH["a100"] == {"nvlink": DEVICES["a100"].nvlink, "infiniband": DEVICES["a100"].nic,
                                 "8 NICs": 8 * DEVICES["a100"].nic}
    for name, device in DEVICES.items():                 # `network.group_link`'s rule at the datasheet
        assert BANDWIDTH[name]["8 NICs"] == min(device.nvlink, 8 * device.nic) == 8 * BANDWIDTH[name]["infiniband"]
    shape = assumed_shape(7_500_000_000)
    assert (MODEL_7_5B["layers"], MODEL_7_5B["hidden"]) == (shape.layers, shape.hidden)
    assert MODEL_7_5B["params"] == cb.PSI_7_5B == 7_467_786_240
