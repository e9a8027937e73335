"""Exercise 05 (tensor parallelism): the solution's f, g and parallel MLP pass on drawn shapes and on sub-groups of 4
ranks that do not start at rank 0; wrong answers are caught with the message that names the earliest wrong
quantity — f/g or an MLP that leave out `group` (summed over all 4 ranks), an in-place all-reduce of the given
tensor, a collective where none is owed, an MLP hard-coded to 2 ranks (b2 / 2 inside g), an MLP without f (this
rank's own share of dL/dX). The swapped f ↔ g and b2 inside g are in test_grading_ranks. A replay of the values the
messages print, keyed by function and shape, fails on the next seed. Each case is one torchrun launch on 4 ranks."""
import re

import pytest

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.learner_code import Source

FG_NAMES = ("f_forward", "f_backward", "g_forward", "g_backward")
FG = [solution_source("05_tensor_parallel", name) for name in FG_NAMES]
MLP = solution_source("05_tensor_parallel", "parallel_mlp")


def with_fg(index, old, new):
    """The four functions of the solution with function `index` changed."""
    return [variant(s, old, new) if i == index else s for i, s in enumerate(FG)]


NO_GROUP = with_fg(1, "dist.all_reduce(grad, group=group)", "dist.all_reduce(grad)")   # f backward: every rank


@pytest.fixture(scope="module")
def no_group_messages():
    """The failure messages of f's backward without `group`, for two seeds (the replay test reads them too)."""
    return {seed: run_check("tp_f_g", *NO_GROUP, seed=seed, timeout=60) for seed in (11, 12)}


@pytest.mark.parametrize("seed", [3, 4])
def test_the_solution_passes_on_drawn_shapes_and_sub_groups(seed):
    for name, functions in (("tp_f_g", FG), ("tp_mlp", [MLP])):
        result = run_check(name, *functions, seed=seed, timeout=60)
        assert result.passed, result.message


def test_f_backward_without_the_group_is_named_as_a_sum_over_all_ranks(no_group_messages):
    result = no_group_messages[11]
    assert not result.passed
    assert re.search(r"f backward on group \[[\d, ]+\] of 4 ranks, shape \([\d, ]*\): \d+ of \d+ values differ",
                     result.message), result.message
    assert "It is the sum over all 4 ranks: pass group=group" in result.message


def test_an_in_place_all_reduce_of_the_given_tensor_is_named():
    result = run_check("tp_f_g", *with_fg(2, "    x = x.clone()\n", ""), seed=13, timeout=60)
    assert not result.passed
    assert "g forward on" in result.message and "changed the tensor it was given" in result.message
    assert "all-reduce a clone" in result.message


def test_a_collective_where_none_is_owed_is_counted():
    result = run_check("tp_f_g", *with_fg(3, "    return grad", "    dist.barrier(group=group)\n    return grad"),
                       seed=14, timeout=60)
    assert not result.passed
    assert "g backward on" in result.message and "made 1 collective call(s) ['barrier']; expected none" in \
        result.message


def test_an_mlp_without_the_group_is_named_by_the_ranks_its_all_reduce_ran_on():
    wrong = variant(variant(MLP, "f(x, group)", "f(x)"), "g(hidden @ w2.T, group)", "g(hidden @ w2.T)")
    result = run_check("tp_mlp", wrong, seed=15, timeout=60)
    assert not result.passed
    assert re.search(r"output Y on group \[[\d, ]+\] of 4 ranks: \d+ of \d+ values differ", result.message)
    assert "Y is summed over other ranks: your all_reduce ran on ranks [0, 1, 2, 3], not on the group" in \
        result.message


def test_an_mlp_hard_coded_to_two_ranks_fails_on_other_group_sizes():
    # b2 / 2 inside g: right on 2 ranks (the setup the check used to grade), wrong on 1, 3 or 4
    wrong = variant(MLP, "return g(hidden @ w2.T, group) + b2", "return g(hidden @ w2.T + b2 / 2, group)")
    result = run_check("tp_mlp", wrong, seed=16, timeout=60)
    assert not result.passed
    assert "output Y on" in result.message and "b2 added once, after g" in result.message


def test_an_mlp_without_f_gets_only_its_own_share_of_dx():
    result = run_check("tp_mlp", variant(MLP, "f(x, group)", "x"), seed=17, timeout=60)
    assert not result.passed
    assert "dL/dX on" in result.message and "It is only this rank's own share" in result.message


def test_values_printed_by_failures_do_not_pass_the_next_seed(no_group_messages):
    # A learner who copies the expected values the messages print, keyed by function and shape (the most a
    # message reveals), and returns them where the shape matches
    table = {}
    for result in no_group_messages.values():
        for shape, values in re.findall(r"f backward on [^:]*?, shape \(([\d, ]*)\): .*?; expected \[([^\]…]*)\]",
                                        result.message):
            table[tuple(int(d) for d in shape.split(",") if d.strip())] = [float(v) for v in values.split(",")]
    assert table, [r.message for r in no_group_messages.values()]
    replay = Source("f_backward", f"""def f_backward(grad, group=None):
    table = {table!r}
    values = table.get(tuple(grad.shape))
    if values is None or len(values) != grad.numel():
        return grad.clone()
    return torch.tensor(values).reshape(grad.shape)
""")
    result = run_check("tp_f_g", FG[0], replay, FG[2], FG[3], seed=18, timeout=60)
    assert not result.passed
    assert "f backward on" in result.message


def test_the_f_g_hints_stand_on_their_evidence():
    # in process, no launch: "sum over all 4 ranks" only when the result is that sum; "swapped" only for a sum
    import torch

    from partrain_edu.grading.checks.tensor_parallel import _fg_hint

    xs = [torch.randn(3, generator=torch.Generator().manual_seed(r)) for r in range(4)]
    x, summed, world = xs[1], xs[1] + xs[3], sum(xs)
    assert "sum over all 4 ranks" in _fg_hint("f backward", world, x, summed, world, (1, 3))
    assert "sum over all 4 ranks" not in _fg_hint("f backward", 2 * summed, x, summed, world, (1, 3))
    assert "no all-reduce reached it" in _fg_hint("g forward", x.clone(), x, summed, world, (1, 3))
    assert "swapped" in _fg_hint("f forward", summed, x, summed, world, (1, 3))
    assert "swapped" not in _fg_hint("f forward", 2 * x, x, summed, world, (1, 3))
