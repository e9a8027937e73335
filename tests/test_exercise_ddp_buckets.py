"""Exercise 02 (DDP's gradient buckets): the solution passes on fixed seeds; wrong answers to the lesson's own point
fail with the message that names the earliest wrong quantity — a wait right after launching (nothing overlaps),
buckets launched once backward has ended, one bucket of everything, buckets filled in forward order, `>` for `>=`
at the cap (a blocking all-reduce and one per parameter: test_grading_ranks) — as do the generic ones: the group ignored
(in the all-reduce, in the world size), a world size hard-coded to 2, a missing average, hooks that do not reset,
hooks that change the parameters. And caps copied from one seed's failure messages do not carry to another seed.
Each grading is one torchrun launch on 3 ranks (seeds fixed, so the drawn configurations are too)."""
import re

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check

SOLUTION = solution_source("02_ddp_buckets", "register_bucket_hooks")
LAUNCH = "launched.append((bucket, flat, dist.all_reduce(flat, group=group, async_op=True)))"


def failure(source, seed: int = 1) -> str:
    result = run_check("ddp_buckets", source, timeout=120, seed=seed)
    assert not result.passed
    assert result.message.count("\n") < 4, result.message  # one readable verdict
    return result.message


def test_the_solution_passes_on_other_seeds():
    for seed in (3, 4):
        result = run_check("ddp_buckets", SOLUTION, timeout=120, seed=seed)
        assert result.passed, result.message


def test_a_wait_right_after_launching_is_named_as_no_overlap():
    message = failure(variant(SOLUTION, LAUNCH, "work = dist.all_reduce(flat, group=group, async_op=True)\n"
                              "            work.wait()\n            launched.append((bucket, flat, work))"))
    assert "configuration 1 (the default group of 3 ranks, cap 1224 B), backward 1: your code waited on all-reduce " \
           "1's work before backward had produced its last gradient (5 of 7 produced), right after launching it" \
           in message
    assert "nothing overlaps" in message


def test_buckets_launched_once_backward_has_ended_are_named_as_late():
    # the right buckets, all-reduced in the callback at the end of backward (test_grading_ranks has a blocking
    # all-reduce inside the hook, and one per parameter)
    late = variant(variant(SOLUTION, "dist.all_reduce(flat, group=group, async_op=True)))", "None))"), "work.wait()",
                   "dist.all_reduce(flat, group=group)")
    message = failure(late)
    assert "after backward produced params[2]'s gradient, bucket 0 was full (1224 B of gradients, cap 1224 B" \
           in message
    assert "Your buckets are right but left late" in message


def test_one_bucket_of_every_gradient_is_named():
    message = failure(variant(SOLUTION, "if size >= cap_bytes:", "if False:"))
    assert "bucket 0 was full (1224 B of gradients" in message
    assert "One bucket of every gradient can only leave once backward has ended" in message


def test_buckets_in_forward_order_are_named():
    message = failure(variant(SOLUTION, "for p in reversed(params):", "for p in params:"))
    assert "cap 1224 B), backward 1: an all-reduce of 36 B left after 1 gradient(s), before bucket 0 was full" \
           in message
    assert "Your buckets follow the forward (registration) order" in message


def test_closing_only_above_the_cap_is_named_at_the_tie():
    message = failure(variant(SOLUTION, "if size >= cap_bytes:", "if size > cap_bytes:"))
    assert "bucket 0 was full (1224 B of gradients, cap 1224 B: a bucket closes once it holds cap_bytes or more), " \
           "but no all-reduce left before the next gradient" in message
    assert "close only once they hold more than 1224 B" in message and "(>=, not >)" in message


def test_an_all_reduce_that_ignores_the_group_is_named():
    message = failure(variant(SOLUTION, "dist.all_reduce(flat, group=group, async_op=True)",
                              "dist.all_reduce(flat, async_op=True)"))
    assert "rank 1 (rank(s) [2] failed this check too): configuration 3 (group [1, 2], cap 792 B)" in message
    assert "all-reduce 1 went over ranks [0, 1, 2], but the group is [1, 2]: pass group=group" in message


def test_the_default_group_size_in_a_sub_group_is_named():
    message = failure(variant(SOLUTION, "n = dist.get_world_size(group)", "n = dist.get_world_size()"))
    assert "configuration 3 (group [1, 2], cap 792 B), backward 1: the gradient of params[0]" in message
    assert "Divided by 3, the default group's size: this group has 2 ranks" in message


def test_a_world_size_hard_coded_to_two_is_named():
    message = failure(variant(SOLUTION, "n = dist.get_world_size(group)", "n = 2"))
    assert "configuration 1 (the default group of 3 ranks, cap 1224 B), backward 1: the gradient of params[0]" \
           in message
    assert "Divided by 2: this group has 3 ranks" in message


def test_a_missing_average_is_named():
    message = failure(variant(SOLUTION, "flat /= n  #", "#"))
    assert "everywhere 3× the expected value" in message
    assert "Missing average: divide the summed bucket by the group's size 3" in message


def test_hooks_that_do_not_reset_fail_the_second_backward():
    # `launched` never cleared: the second backward queues no callback, so nothing is waited on or copied back
    message = failure(variant(SOLUTION, "        launched.clear()\n", ""))
    assert "configuration 1 (the default group of 3 ranks, cap 1224 B), backward 2: the gradient of params[0]" \
           in message
    assert "That is this rank's local gradient" in message


def test_hooks_that_step_the_parameters_are_named():
    # an optimizer step fused into the hook: the gradients are right, the parameters must not move
    message = failure(variant(SOLUTION, "offset += q.numel()", "offset += q.numel()\n"
                              "                q.data.sub_(0.01 * q.grad)"))
    assert "configuration 1 (the default group of 3 ranks, cap 1224 B), backward 1: params[0] after backward" \
           in message
    assert "Your hooks changed a parameter: they own .grad only" in message


def with_caps(caps: set) -> object:
    """A `>` answer that learned from failure messages to close at exactly these caps (a table keyed by cap)."""
    return variant(SOLUTION, "if size >= cap_bytes:",
                   f"if size > cap_bytes or (size == cap_bytes and cap_bytes in {tuple(sorted(caps))!r}):")


def test_caps_copied_from_one_seeds_messages_do_not_carry_to_another_seed():
    seen = set()
    first = failure(with_caps(seen), seed=1)
    seen |= {int(c) for c in re.findall(r"cap (\d+) B\)", first)}
    assert seen and "configuration 1 (" in first
    again = run_check("ddp_buckets", with_caps(seen), timeout=120, seed=1)
    assert "configuration 1 (" not in again.message  # the table fixed the configuration it was copied from
    other = failure(with_caps(seen), seed=2)  # a fresh seed draws caps the table has never seen
    assert "configuration 1 (" in other and "close only once they hold more than" in other
    assert not seen & {int(c) for c in re.findall(r"cap (\d+) B\)", other)}
