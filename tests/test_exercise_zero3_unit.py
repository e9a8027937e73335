"""Exercise 08 (a ZeRO-3 / FSDP unit; the solution is graded in test_exercises): three wrong answers are caught with
the message that names the mistake — an all-reduce where FSDP reduce-scatters (2× DDP's bytes instead of 1.5×),
plain autograd that keeps every gathered unit for backward (peak = all parameters), a forward's gathered W kept on
ctx although backward gathers again (not freed after use), and a reduce-scatter never divided by n. Each case is
one torchrun launch on 2 ranks."""
from exercise_sources import solution_source, variant

from partrain_edu.grading import run_check

SOLUTION = solution_source("08_zero3_unit", "fsdp_step")


def grade(source):
    return run_check("zero3_unit", source, timeout=120)


def test_an_all_reduce_instead_of_a_reduce_scatter_is_named_with_its_bytes():
    wrong = variant(SOLUTION, """        mine = torch.empty(full_grad.numel() // n)
        dist.reduce_scatter_tensor(mine, full_grad, group=group)
""", """        full_grad = full_grad.clone()
        dist.all_reduce(full_grad, group=group)           # every rank gets the whole sum, keeps 1/n
        s, me = full_grad.numel() // n, dist.get_rank(group)
        mine = full_grad[me * s:(me + 1) * s]
""")
    result = grade(wrong)
    assert not result.passed
    assert "you called ['all_reduce']" in result.message
    assert "the units sent 6528 B, 2× DDP's 3264 B instead of 1.5×" in result.message


def test_plain_autograd_keeps_every_gathered_unit_and_never_gathers_again():
    # the natural first try: gathered parameters that require grad; autograd saves W for backward
    wrong = variant(SOLUTION, """    for shard in units:
        h = Unit.apply(h, shard)
""", """    fulls = []
    for shard in units:
        fulls.append(gather(shard, group).requires_grad_())
        Wk, bk = views(fulls[-1], [(d, d), (d,)])
        h = torch.tanh(h @ Wk.T + bk)
""")
    wrong = variant(wrong, """            shard -= lr * shard.grad
            shard.grad = None
""", """            shard -= lr * reduce_scatter_mean(fulls.pop(0).grad)
""")
    result = grade(wrong)
    assert not result.passed
    assert "the units were all-gathered 3 time(s); expected 6" in result.message
    assert "peak 3472 B of gathered full parameters alive at once (root, unit 0, unit 1, unit 2)" in result.message
    assert "every unit was gathered once and kept through backward" in result.message


def test_a_gathered_weight_kept_on_ctx_is_named_as_not_freed():
    # backward gathers again, but the forward's W (a view: it keeps the whole gathered buffer) lives on ctx
    wrong = variant(SOLUTION, "            return out ", "            ctx.kept = W\n            return out ")
    result = grade(wrong)
    assert not result.passed
    assert "peak 4560 B" in result.message and "at the gather of unit 2 for backward" in result.message
    assert "Not freed after use: unit 0, unit 1, unit 2." in result.message


def test_a_reduce_scatter_not_divided_by_n_is_named():
    result = grade(variant(SOLUTION, "return mine / n ", "return mine "))
    assert not result.passed
    assert "step 1, root's shard on rank 0 after the update" in result.message
    assert "It moved 2× too far" in result.message and "divide by n = 2" in result.message
