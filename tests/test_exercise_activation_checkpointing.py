"""Exercise 10, activation checkpointing under a memory budget (1 rank; the solution is graded in test_exercises):
checkpointing every block, checkpointing none, a greedy choice and a detached input each fail with a message
naming the mistake. The budgets themselves are tested too: the bytes the check measures follow the stated formula,
and at the tight budget a greedy order fits but recomputes more than the optimum, which single-block checkpoints
reach."""
import itertools

from exercise_sources import solution_source, variant

from partrain_edu.grading import run_check
from partrain_edu.grading.checks import activation_checkpointing as ac

NAME = "activation_checkpointing"
SOLUTION = solution_source("10_activation_checkpointing", "forward_under_budget")
RUN = "x = checkpoint(block, x, use_reentrant=False) if i in best[1] else block(x)"
TIGHT = ac.BUDGETS[0]


def message(source) -> str:
    result = run_check(NAME, source, timeout=120)
    assert not result.passed, "a wrong answer passed"
    return result.message


def test_the_measured_bytes_follow_the_formula_and_the_tight_budget_defeats_a_greedy_order():
    flops, held = ac.measured()
    rows, d, w = ac.ROWS, ac.WIDTHS, ac.HIDDEN
    plain = [4 * rows * (d[i] + (2 if act == "gelu" else 1) * w[i]) for i, act in enumerate(ac.ACTIVATIONS)]
    assert flops == [2 * rows * w[i] * (d[i] + d[i + 1]) for i in range(len(w))]
    for plan, got in held.items():  # plain blocks hold their formula's bytes, a checkpoint its input's alone
        assert got == sum(4 * rows * d[s] if ckpt else sum(plain[s:e]) for s, e, ckpt in plan), plan
    assert ac.cheapest(ac.BUDGETS[-1]) == (0, ac.plan_of(frozenset(), merged=False))  # the loose one fits plainly
    cost, best = ac.cheapest(TIGHT)
    n = len(ac.HIDDEN)
    one_by_one = [ac.plan_of(frozenset(c), False) for k in range(n + 1) for c in itertools.combinations(range(n), k)]
    fits = sorted(sum(flops[i] for i in ac.recomputed_by(p)) for p in one_by_one if held[p] <= TIGHT)
    assert fits[0] == cost < fits[1] and ac.plan_of(ac.recomputed_by(best), False) == best  # unique, unmerged
    greedy: set[int] = set()
    for i in sorted(range(n), key=lambda i: plain[i] - 4 * rows * d[i], reverse=True):  # most bytes saved first
        if held[ac.plan_of(frozenset(greedy), False)] <= TIGHT:
            break
        greedy.add(i)
    assert held[ac.plan_of(frozenset(greedy), False)] <= TIGHT and sum(flops[i] for i in greedy) > cost


def test_checkpointing_every_block_fits_but_is_told_it_recomputes_too_much():
    text = message(variant(SOLUTION, RUN, "x = checkpoint(block, x, use_reentrant=False)"))
    assert f"budget {TIGHT} B: you recomputed blocks 0, 1, 2, 3, 4, 5" in text
    assert str(sum(ac.measured()[0])) in text and str(ac.cheapest(TIGHT)[0]) in text  # both costs
    assert "checkpointing every block always fits" in text


def test_checkpointing_nothing_is_over_the_budget():
    text = message(variant(SOLUTION, RUN, "x = block(x)"))
    assert "B over the budget (you recomputed no block)" in text and "checkpoint blocks 0, 2, 4" in text


def test_a_greedy_choice_fits_but_is_not_the_cheapest():
    choose = SOLUTION.text[SOLUTION.text.index("    n, best = "):SOLUTION.text.index("    # 3. Run")]
    greedy = ("    n, best = len(blocks), (0, set())\n"
              "    for i in sorted(range(n), key=lambda i: plain[i] - kept[i], reverse=True):\n"
              "        if sum(kept[j] if j in best[1] else plain[j] for j in range(n)) <= budget_bytes:\n"
              "            break\n"
              "        best[1].add(i)\n")
    text = message(variant(SOLUTION, choose, greedy))
    assert f"budget {TIGHT} B: you recomputed blocks 1, 4" in text and "checkpoint blocks 0, 2, 4" in text
    assert "0/1 knapsack" in text


def test_a_detached_block_input_breaks_the_gradients():
    text = message(variant(SOLUTION, RUN, RUN.replace("checkpoint(block, x,", "checkpoint(block, x.detach(),")))
    assert "dL/dx: expected a tensor" in text and "the graph must stay connected" in text
