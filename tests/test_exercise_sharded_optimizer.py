"""Exercise 09 (a ZeRO-1 sharded optimizer wrapping any torch.optim class; the solution is graded in test_exercises):
six wrong answers are caught with the message that names the mistake — every rank keeping the whole optimizer
state, param groups flattened into one (their lr and weight decay lost), the frozen parameter given an owner, the
owners' broadcast forgotten, the parameter list cut in contiguous halves (unbalanced shards), and an all-reduce
inside step(). Each case is one torchrun launch on 2 ranks."""
from exercise_sources import solution_source, variant

from partrain_edu.grading import run_check

SOLUTION = solution_source("09_sharded_optimizer", "make_sharded_optimizer")


def grade(source):
    return run_check("sharded_optimizer", source, timeout=120)


def failure(source) -> str:
    result = grade(source)
    assert not result.passed
    assert result.message.count("\n") < 4  # one readable verdict
    return result.message


def test_every_rank_keeping_the_whole_state_is_named_with_its_bytes():
    # each rank steps every trainable parameter (then still broadcasts from the owner): right values, 2× memory
    message = failure(variant(SOLUTION, 'if owner.get(id(p)) == me]', 'if p.requires_grad]'))
    assert "AdamW over two param groups, step 1: rank 0 holds 1868 B of optimizer state" in message
    assert "the whole single-process state is 1868 B: every rank keeps state for every parameter" in message


def test_flattened_param_groups_lose_their_options():
    message = failure(variant(SOLUTION, 'optimizer_class([g for g in mine if g["params"]], **defaults)',
                              'optimizer_class([p for g in mine for p in g["params"]], **defaults)'))
    assert "AdamW over two param groups, step 1: temperature after step()" in message
    assert "its param group asks {'lr': 0.01, 'weight_decay': 0.1" in message
    assert "keep each param group's options" in message


def test_a_frozen_parameter_with_an_owner_is_named():
    message = failure(variant(SOLUTION, 'for p in g["params"] if p.requires_grad]', 'for p in g["params"]]'))
    assert "the frozen parameter embed (requires_grad=False) is in rank(s) [0]'s inner optimizer" in message


def test_a_forgotten_broadcast_names_the_stale_parameter_and_its_owner():
    message = failure(variant(SOLUTION, "dist.broadcast(p.detach(), src=src, group=group)", "pass"))
    assert "step 1: temperature after step()" in message
    assert "rank 1 owns and updated it, but the update never reached rank 0" in message


def test_unbalanced_shards_exceed_the_greedy_bound():
    # the parameter list cut in two contiguous halves: rank 0 gets both big weights
    wrong = variant(SOLUTION, "for p in sorted(trainable, key=lambda p: -p.numel() * p.element_size()):",
                    "for i, p in enumerate(trainable):")
    message = failure(variant(wrong, "r = min(range(n), key=lambda q: load[q])", "r = i * n // len(trainable)"))
    assert "rank 0 holds 1628 B of the 1868 B of optimizer state" in message
    assert "S/n + (1 − 1/n)·s_max = 1320 B" in message and "least-loaded rank, largest first" in message


def test_an_all_reduce_inside_step_is_named():
    # values stay right (averaging averaged gradients changes nothing); the traffic does not
    message = failure(variant(SOLUTION, "self.optim.step()  ",
                              "for p in trainable:\n                dist.all_reduce(p.grad)\n"
                              "                p.grad /= n\n            self.optim.step()  "))
    assert "step() called ['all_reduce']: the gradients arrive already averaged" in message
