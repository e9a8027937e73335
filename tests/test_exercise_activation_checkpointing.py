"""Exercise 10, activation checkpointing under a memory budget (1 rank), on stacks and budgets drawn from a seed.

The plans: the bytes the check measures follow activation_plans' formulas on every plan of drawn stacks, and each
run's four budgets are a tight one where both greedy orders miss the cheapest plan, one exactly at a frontier
plan's bytes, one in between and a loose one. On a rank (one torchrun launch each): the solution passes for two
seeds, and a greedy choice fails. In-process (the observe half run here, then the same verify: what a launch
does, without one): checkpointing every block, checkpointing nothing, a greedy choice, `<` instead of `≤`, one
checkpoint per block where one around consecutive blocks is needed, a detached block input, an answer that edits
x, and one hard-coded to the old check's budgets each fail, naming the earliest wrong quantity by how much and
never the cheapest plan; a table of the best plans of three runs fails on a fourth.
"""
import json
import random
import types

import pytest
import torch

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.checks import activation_checkpointing as ac
from partrain_edu.grading.checks import activation_plans as plans
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import verify
from partrain_edu.grading.on_ranks import namespace_for
from partrain_edu.grading.runner import spec_of

NAME = "activation_checkpointing"
SOLUTION = solution_source("10_activation_checkpointing", "forward_under_budget")
RUN = SOLUTION.text[SOLUTION.text.index("    i = 0\n    while i < n:"):SOLUTION.text.rindex("    return x")]
CHOOSE = SOLUTION.text[SOLUTION.text.index("    n, best = len(blocks), None"):
                       SOLUTION.text.index("    if best is None:")]
GREEDY = ("    n, best = len(blocks), (0, set())\n"
          "    for i in sorted(range(n), key=lambda i: plain[i] - kept[i], reverse=True):\n"
          "        if sum(kept[j] if j in best[1] else plain[j] for j in range(n)) <= budget_bytes:\n"
          "            break\n"
          "        best[1].add(i)\n")


def graded_here(source: Source, seed: int) -> list[str]:
    """The check's problems with `source` for the run of `seed`, its observe half run in this process as the rank
    runs it (rank_main: the source compiled into the check's namespace), then verified the same way."""
    spec = spec_of(NAME, 1)
    namespace = namespace_for(spec)
    exec(compile(source.text, f"<your {source.name}>", "exec"), namespace)
    observed = spec.observe(types.SimpleNamespace(rank=0, world_size=1), namespace[source.name], seed=seed)
    return verify(spec, json.dumps([observed]), seed)


def message(source: Source, seed: int) -> str:
    problems = graded_here(source, seed)
    assert len(problems) == 1, f"a wrong answer passed on seed {seed}"
    return problems[0]


@pytest.mark.parametrize("seed", [3, 8])
def test_the_measured_bytes_follow_the_formulas_and_the_budgets_are_the_four_kinds(seed):
    run = ac.run_of(seed)
    stack, ref = run.stack, ac.measured(run)
    n = len(stack.hidden)
    assert ref["flops"] == [stack.flops(i) for i in range(n)]
    for plan, got in ref["held"].items():  # plain blocks hold their formula's bytes, a checkpoint its input's alone
        assert got == sum(stack.kept(s) if ckpt else sum(stack.plain(i) for i in range(s, e)) for s, e, ckpt in plan)
    for chosen in stack.choices():
        for merged in (False, True):
            assert ref["held"][plans.plan_of(chosen, merged, n)] == stack.held(chosen, merged)
    points = plans.frontier(stack)
    least = {b: min(stack.cost(c) for c in stack.choices() if stack.held(c) <= b) for b in run.budgets}
    plain = stack.held(frozenset())
    kinds = {"loose": [b for b in run.budgets if b >= plain], "exact": [b for b in run.budgets if b in dict(points)],
             "tight": [b for b in run.budgets if all(g is None or stack.cost(g) > least[b] for g in (
                 plans.greedy(stack, b, "bytes saved"), plans.greedy(stack, b, "bytes saved per FLOP")))]}
    assert all(kinds.values()) and len(set(run.budgets)) == 4, (run.budgets, kinds)
    assert all(b < plain for b in kinds["tight"]) and least[min(run.budgets)] > 0


def test_the_solution_passes_on_a_rank_for_two_seeds():
    for seed in (1, 2):
        result = run_check(NAME, SOLUTION, seed=seed)
        assert result.passed, result.message


def test_a_greedy_choice_fails_on_a_rank_by_how_much_it_recomputes():
    result = run_check(NAME, variant(SOLUTION, CHOOSE, GREEDY), seed=3)
    text = result.message
    assert not result.passed
    assert "you recomputed blocks 0, 2, 3, 4 in backward (9640 FLOPs)" in text, text
    assert "yours is 2056 FLOPs more" in text and "0/1 knapsack" in text


@pytest.mark.parametrize("old, new, seed, words", [
    (RUN, "    for block in blocks:\n        x = checkpoint(block, x, use_reentrant=False)\n", 1,
     ["budget 2566 B: you recomputed blocks 0, 1, 2, 3, 4, 5 in backward (13640 FLOPs)",
      "no less than 3940 FLOPs: yours is 9700 FLOPs more", "checkpointing every block always fits"]),
    (RUN, "    for block in blocks:\n        x = block(x)\n", 1,
     ["budget 2566 B: autograd held 3740 B", "1174 B over the budget (you recomputed no block)"]),
    (CHOOSE, GREEDY, 1,
     ["budget 2566 B: you recomputed blocks 0, 3", "yours is 500 FLOPs more", "most bytes saved first",
      "0/1 knapsack"]),
    ("if held <= budget_bytes and", "if held < budget_bytes and", 3,
     ["budget 2720 B: you recomputed block 4", "yours is 1592 FLOPs more",
      "both the cheapest plan holding less than 2720 B and what taking blocks by most",
      "compare with bytes ≤ budget (not <)"]),
    ("else kept[i] if i - 1 not in chosen else 0", "else kept[i]", 2,
     ["budget 962 B: you recomputed block 1", "yours is 80 FLOPs more",
      "one checkpoint per block; consecutive blocks under one checkpoint hold only the first one's input"]),
    ("x = blocks[i](x)", "x = blocks[i](x.detach())", 1,
     ["budget 2566 B, dL/dx: expected a tensor of shape (5, 7), got NoneType", "the graph must stay connected"]),
    ("    plain, kept, flops = [], [], []\n", "    plain, kept, flops = [], [], []\n    x.data.clamp_(-1, 1)\n", 1,
     ["budget 2566 B: your function changed x", "must not edit"]),
    ("    plain, kept, flops = [], [], []\n",
     "    plain, kept, flops = [], [], []\n    blocks[1][2].bias.data.zero_()\n", 1,
     ["budget 2566 B: your function changed the parameter 1.2.bias of the blocks"]),
    (CHOOSE, "    n, best = len(blocks), (0, {2450: {0, 2, 4}, 3000: {1, 4}}.get(budget_bytes, set()))\n", 1,
     ["budget 2566 B: autograd held 3740 B", "over the budget"]),  # hard-coded to the old check's budgets
], ids=["all-blocks", "no-block", "greedy", "strict-less", "one-checkpoint-per-block", "detached", "edits-x",
        "edits-a-block", "hard-coded"])
def test_a_wrong_answer_names_the_earliest_wrong_quantity_not_the_plan(old, new, seed, words):
    text = message(variant(SOLUTION, old, new), seed)
    for word in words:
        assert word in text, (word, text)
    assert "cheapest plan that fits" not in text and "checkpoint blocks" not in text, text  # the old giveaway


def best_plans(seed: int) -> dict:
    """{(the stack's widths, hidden widths, activations, rows, budget): the blocks the cheapest plan recomputes}
    for every budget of run `seed`: more than any failure message says (it names quantities, not plans)."""
    run = ac.run_of(seed)
    s, ref = run.stack, ac.measured(run)
    table = {}
    for budget in run.budgets:
        fits = [p for p, b in ref["held"].items() if b <= budget]
        best = min(fits, key=lambda p: sum(ref["flops"][i] for i in plans.recomputed_by(p)))
        table[(s.widths, s.hidden, s.activations, s.rows, budget)] = sorted(plans.recomputed_by(best))
    return table


def test_a_table_of_three_runs_best_plans_fails_on_a_fourth():
    table = {}
    for seed in (101, 102, 103):
        table.update(best_plans(seed))
    assert not set(table) & set(best_plans(104))  # a fresh run's stacks and budgets are others
    replay = Source("forward_under_budget", f'''def forward_under_budget(blocks, x, budget_bytes):
    table = {table!r}
    widths = tuple([b[0].in_features for b in blocks] + [blocks[-1][2].out_features])
    key = (widths, tuple(b[0].out_features for b in blocks),
           tuple("gelu" if isinstance(b[1], nn.GELU) else "relu" for b in blocks), x.shape[0], budget_bytes)
    chosen = table.get(key, list(range(len(blocks))))   # unknown: checkpoint everything, which always fits
    i = 0
    while i < len(blocks):  # consecutive chosen blocks under one checkpoint, as the plans in the table are
        j = i + 1
        while i in chosen and j in chosen:
            j += 1
        part = nn.Sequential(*blocks[i:j])
        x = checkpoint(part, x, use_reentrant=False) if i in chosen else part(x)
        i = j
    return x
''')
    assert graded_here(replay, 101) == []  # the table answers the runs it was made from ...
    text = message(replay, 104)            # ... and no other
    assert "FLOPs more" in text and "checkpointing every block always fits" in text, text


def test_the_stacks_and_budgets_of_many_runs_differ():
    runs = [ac.run_of(seed) for seed in random.Random(0).sample(range(10**6), 200)]
    assert len({(run.stack, run.budgets) for run in runs}) == 200
    assert {len(run.stack.hidden) for run in runs} == {5, 6, 7} and {run.stack.rows for run in runs} == {2, 3, 4, 5}
    assert torch.equal(ac.build(ac.run_of(5))[1], ac.build(ac.run_of(5))[1])  # the same seed, the same x
