"""Exercise 13, communication bounds (in-process): the four solution functions pass on several seeds, and so do
other honest float orderings of the closed forms (the cases at the bound are exact in floats); every run draws a
case at the bound, one answering 1, one with a fraction above ½ and a pair differing only in what cancels, from
the course's devices and links. Wrong answers (the whole step's FLOPs, ZeRO-3's bytes all behind backward, a Ψ or
token count that does not cancel, no (N−1)/N, < instead of ≤, rounding to nearest, floats, tokens for
sequences…) each fail with a message naming the mistake; where two mistakes give the same numbers (four TP
all-reduces against the forward, or fp32 bytes) the hint names both, and a factor seen in one case only names
none. The closed forms equal a search over degrees priced pass by pass with the ring model of `theory.traffic`.
A table of the answers that a few runs' messages named fails the next run."""
import ast
import linecache
import math
import re
from fractions import Fraction

import pytest

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.checks import communication_bounds as cb
from partrain_edu.grading.givens.communication_bounds import BANDWIDTH, MODEL_7_5B, PEAK_FLOPS
from partrain_edu.grading.learner_code import Source
from partrain_edu.theory.hardware import DEVICES, PRESETS
from partrain_edu.theory.network import DATASHEET, EFFICIENCY, group_link
from partrain_edu.theory.planner import assumed_shape
from partrain_edu.theory.traffic import LINKS, ring_bytes_sent

NOTEBOOK = "13_communication_bounds"
FUNCTIONS = ("max_dp_degree", "max_fsdp_degree", "max_tp_degree", "min_dp_batch")  # each graded by its namesake
SEED = 11


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


def cases_of(name: str, seed: int):
    return {"max_dp_degree": lambda: cb.dp_cases(seed, name), "max_fsdp_degree": lambda: cb.dp_cases(seed, name),
            "max_tp_degree": lambda: cb.tp_cases(seed), "min_dp_batch": lambda: cb.batch_cases(seed)}[name]()


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_solution_passes_on_several_seeds(function):
    for seed in (1, 2, 3):
        result = run_check(function, learner(solution(function)), seed=seed)
        assert result.passed, result.message


def test_other_float_orderings_of_the_closed_forms_pass_at_the_exact_bound():
    honest = {"max_dp_degree": lambda p, t, f, b: 1 + math.floor(b / f * t),
              "max_fsdp_degree": lambda p, t, f, b: 1 + int(t / f * b),
              "max_tp_degree": lambda h, t, f, b: 1 + math.floor(3 * h / f * b),
              "min_dp_batch": lambda n, s, f, b: n * max(1, math.ceil((n - 1) / n * f / (s * b)))}
    for name, fn in honest.items():
        for seed in range(20):
            assert run_check(name, fn, seed=seed).passed, (name, seed)


DP_FLOOR = "1 + math.floor(tokens_per_step * bandwidth / peak_flops)"
TP_FLOOR = "1 + math.floor(3 * hidden * bandwidth / peak_flops)"
PER_DEVICE = "math.ceil((degree - 1) * peak_flops / (degree * seq_len * bandwidth))"
BOTH = "these give the same numbers: check each"


@pytest.mark.parametrize("function, old, new, words", [
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(1.5 * tokens_per_step * bandwidth / peak_flops)",
     ["whole step's 6Ψ", "backward's 4Ψ per token alone"]),
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(2 * tokens_per_step * bandwidth / peak_flops)",
     ["half the bytes", "Ψ bytes for Ψ bf16 values", "both directions", BOTH]),
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(tokens_per_step * bandwidth / peak_flops / 2)",
     ["twice the bytes, or half the compute", "fp32", "counted twice", "forward's 2Ψ", BOTH]),
    ("max_dp_degree", DP_FLOOR, "max(1, math.floor(tokens_per_step * bandwidth / peak_flops))",
     ["one below wherever the bound is not whole", "(N−1)/N"]),
    ("max_dp_degree", DP_FLOOR, "1 + tokens_per_step * bandwidth / peak_flops",
     ["expected the whole number", "return an int"]),
    ("max_dp_degree", DP_FLOOR, "1 + math.floor(tokens_per_step * bandwidth / peak_flops * (params / 1.3e9) ** 0.1)",
     ["only Ψ changed", "cancels"]),
    ("max_dp_degree", DP_FLOOR, "math.ceil(tokens_per_step * bandwidth / peak_flops)",
     ["the bound hit exactly", "exactly as long as compute", "(N−1)·F ≤ T·β"]),
    ("max_dp_degree", DP_FLOOR, "1 + round(tokens_per_step * bandwidth / peak_flops)",
     ["fraction is over ½", "not to the nearest"]),
    ("max_fsdp_degree", DP_FLOOR, "1 + math.floor(2 / 3 * tokens_per_step * bandwidth / peak_flops)",
     ["forward's all-gather", "all three collectives against backward alone"]),
    ("max_fsdp_degree", DP_FLOOR, "1 + math.floor(1.5 * tokens_per_step * bandwidth / peak_flops)",
     ["two collectives against the whole step's 6Ψ"]),
    ("max_fsdp_degree", DP_FLOOR, "1 + math.floor(tokens_per_step * bandwidth / peak_flops / 2)",
     ["twice the bytes: 4-byte fp32", "priced like an all-reduce", BOTH]),
    ("max_tp_degree", TP_FLOOR, "1 + math.floor(4.5 * hidden * bandwidth / peak_flops)",
     ["whole step: 4 all-reduces against 72bsh²/t", "overlap only the forward"]),
    ("max_tp_degree", TP_FLOOR, "1 + math.floor(2 * hidden * bandwidth / peak_flops)",
     ["the MLP's two h×4h matmuls alone", "24bsh² in all"]),
    ("max_tp_degree", TP_FLOOR, "1 + math.floor(3 * hidden * bandwidth / peak_flops * tokens_per_device / 2048)",
     ["only the tokens changed", "cancels"]),
    ("min_dp_batch", "return degree * max(1, per_device)",
     "return max(1, math.ceil((degree - 1) * peak_flops / (seq_len * bandwidth)))",
     ["round up to a multiple of N"]),
    ("min_dp_batch", "return degree * max(1, per_device)", "return seq_len * degree * max(1, per_device)",
     ["not tokens"]),
    ("min_dp_batch", PER_DEVICE, PER_DEVICE.replace("ceil", "floor"),
     ["too small wherever the bound is not whole", "round up"]),
    ("min_dp_batch", PER_DEVICE, "math.floor((degree - 1) * peak_flops / (degree * seq_len * bandwidth)) + 1",
     ["the bound hit exactly", "exactly as long as compute", "B·s·β ≥ (N−1)·F"]),
    ("min_dp_batch", PER_DEVICE, "math.ceil(2 / 3 * (degree - 1) * peak_flops / (degree * seq_len * bandwidth))",
     ["whole step's 6Ψ"]),
    ("min_dp_batch", PER_DEVICE, "math.ceil(peak_flops / (seq_len * bandwidth))", ["forgot the ring's (N−1)/N"]),
], ids=["dp-whole-step", "dp-half-bytes", "dp-double-bytes", "dp-no-ring-factor", "dp-float", "dp-psi-matters",
        "dp-ceil-at-tie", "dp-round", "fsdp-all-behind-backward", "fsdp-two-against-step", "fsdp-fp32",
        "tp-whole-step", "tp-mlp-only", "tp-tokens-matter", "batch-not-a-multiple", "batch-in-tokens",
        "batch-rounded-down", "batch-strict-at-tie", "batch-whole-step", "batch-no-ring-factor"])
def test_a_wrong_answer_is_caught_naming_the_mistake(function, old, new, words):
    result = run_check(function, learner(variant(solution(function), old, new)), seed=SEED)
    assert not result.passed
    for word in words:
        assert word in result.message, (word, result.message)


def test_four_tp_all_reduces_against_the_forward_name_fp32_too_as_the_numbers_cannot_tell():
    # 4 all-reduces instead of 2, against the forward: (t−1)·F ≤ 1.5hβ, exactly what 4-byte elements give
    four = variant(solution("max_tp_degree"), TP_FLOOR, "1 + math.floor(3 * hidden * bandwidth / peak_flops / 2)")
    text = run_check("max_tp_degree", learner(four), seed=SEED).message
    assert "the backward's 2 all-reduces counted too (4 against the forward's 24bsh²/t)" in text
    assert "4-byte fp32 activations" in text and BOTH in text


def test_a_factor_seen_in_one_case_only_names_no_cause():
    cases = cb.dp_cases(SEED, "max_dp_degree")
    first = cases[2][1]   # one case priced at 1.5×, the others right: no evidence of the whole step's FLOPs

    def odd(params, tokens, flops, bandwidth):
        k = 1.5 if (params, tokens, flops, bandwidth) == first else 1
        return 1 + math.floor(k * tokens * bandwidth / flops)
    text = run_check("max_dp_degree", odd, seed=SEED).message
    assert "is communication-bound: return the largest degree" in text and "6Ψ" not in text, text


def test_an_answer_that_imports_the_checks_closed_form_is_refused():
    cheat = Source("max_dp_degree", "def max_dp_degree(params, tokens_per_step, peak_flops, bandwidth):\n"
                   "    from partrain_edu.grading.checks.communication_bounds import dp_slack, largest_degree\n"
                   "    return largest_degree(dp_slack(params, tokens_per_step, peak_flops, bandwidth))\n")
    result = run_check("max_dp_degree", learner(cheat))
    assert not result.passed and "partrain_edu.grading.checks.communication_bounds" in result.message


def test_every_run_draws_a_tie_a_one_a_fraction_above_half_and_a_pair_from_the_courses_hardware():
    betas = {group_link(d, m, k, efficiency=e).beta for d in PRESETS.values() for e in (DATASHEET, EFFICIENCY)
             for k in (1, 2, 4, 8) for m in (2 * k, 3 * k)} | {d.nvlink * e["nvlink"] for d in PRESETS.values()
                                                               for e in (DATASHEET, EFFICIENCY)}
    peaks = {d.peak_flops for d in PRESETS.values()}
    for seed in range(25):
        for slack_of, cases in [(cb.dp_slack, cb.dp_cases(seed, "max_dp_degree")),
                                (cb.dp_slack, cb.dp_cases(seed, "max_fsdp_degree")),
                                (cb.tp_slack, cb.tp_cases(seed))]:
            slacks = [slack_of(*args) for _, args in cases]
            assert sum(s.denominator == 1 for s in slacks) == 1 and any(s < 1 for s in slacks)
            assert any(s % 1 > Fraction(1, 2) and s > 2 for s in slacks)
            assert slacks[0] == slacks[1] and cases[0][1] != cases[1][1] and cases[0][1][2:] == cases[1][1][2:]
            for label, (_, _, flops, beta) in cases:
                assert "exactly" in label or (beta in betas and any(flops == p * round(flops / p, 2) for p in peaks))
        need = [cb.batch_need(*args) / args[0] for _, args in cb.batch_cases(seed)]
        assert sum(n.denominator == 1 and n >= 1 for n in need) == 1 and any(n < 1 for n in need)
    drawn = {args for seed in range(25) for _, args in cb.dp_cases(seed, "max_dp_degree")}
    assert len(drawn) == 25 * 7   # no two runs share a case


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


@pytest.mark.parametrize("name, passes_of, slack_of", [
    ("max_dp_degree", dp_passes, cb.dp_slack), ("max_fsdp_degree", fsdp_passes, cb.dp_slack),
    ("max_tp_degree", tp_passes, cb.tp_slack)], ids=["dp", "fsdp", "tp"])
def test_each_closed_form_is_the_largest_degree_whose_passes_hide_their_collectives(name, passes_of, slack_of):
    for seed in range(4):
        for label, (size, tokens, flops, bandwidth) in cases_of(name, seed):
            best = cb.largest_degree(slack_of(size, tokens, flops, bandwidth))
            below = sorted({1, best, *range(max(1, best - 20), best)})
            assert all(hides(passes_of(n, size, tokens), flops, bandwidth) for n in below), label
            assert not any(hides(passes_of(n, size, tokens), flops, bandwidth) for n in range(best + 1, best + 60))


def test_the_smallest_batch_is_the_first_multiple_of_n_whose_all_reduce_hides():
    for seed in range(4):
        for label, (n, seq, flops, bandwidth) in cb.batch_cases(seed):
            want = cb.min_batch(n, seq, flops, bandwidth)
            assert hides(dp_passes(n, 10**9, want * seq), flops, bandwidth), label
            assert want == n or not hides(dp_passes(n, 10**9, (want - n) * seq), flops, bandwidth), label


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
    assert MODEL_7_5B["params"] == 7_467_786_240


# --- replay: a table of what the messages named -------------------------------------------------------------

def test_a_table_of_the_answers_a_few_runs_named_fails_the_next_run():
    for name in FUNCTIONS:
        table = {}

        def replay(*args, table=table):
            return table.get(args, 1)

        for seed in (21, 22, 23):   # fix each named case until the run passes, as a learner reading messages would
            for _ in range(10):
                result = run_check(name, replay, seed=seed)
                if result.passed:
                    break
                found = re.search(rf"{name}(\([^)]*\)) — .*?: expected (?:the whole number )?(\d+)", result.message)
                table[ast.literal_eval(found[1])] = int(found[2])
            assert result.passed, result.message
        assert not run_check(name, replay, seed=24).passed, name
