"""Exercise 09 (a ZeRO-1 sharded optimizer wrapping any torch.optim class): the solution passes on fixed seeds; wrong
answers fail with the message that names the mistake — every rank keeping the whole optimizer state, param groups
flattened into one (their options lost), a frozen parameter given an owner, the owners' broadcast forgotten,
unbalanced shards, an all-reduce inside step(), zero_grad() clearing only owned gradients — as do the generic
ones: the group ignored, a group rank passed as broadcast's src, an inner optimizer over copies of the parameters,
a class hard-coded instead of optimizer_class. And param-group options copied from one seed's failure messages do
not carry to another seed. Each grading is one torchrun launch on 3 ranks (seeds fixed, so the drawn
configurations are too)."""
import ast
import re

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check

SOLUTION = solution_source("09_sharded_optimizer", "make_sharded_optimizer")
INNER = 'inner = optimizer_class([g for g in mine if g["params"]], **defaults)'
BROADCAST = "dist.broadcast(p.detach(), src=src, group=group)"


def grade(source, seed: int):
    return run_check("sharded_optimizer", source, timeout=120, seed=seed)


def failure(source, seed: int = 1) -> str:
    result = grade(source, seed)
    assert not result.passed
    assert result.message.count("\n") < 4, result.message  # one readable verdict
    return result.message


def test_the_solution_passes_on_other_seeds():
    for seed in (3, 4):
        result = grade(SOLUTION, seed)
        assert result.passed, result.message


def test_every_rank_keeping_the_whole_state_is_named_with_its_bytes():
    # each rank steps every trainable parameter (then still broadcasts from the owner): right values, 3× the memory
    message = failure(variant(SOLUTION, 'if owner.get(id(p)) == me]', 'if p.requires_grad]'))
    assert "AdamW over 3 param groups, step 1: rank 0 holds 3084 B of optimizer state" in message
    assert "the whole single-process state is 3084 B: every rank keeps state for every parameter" in message


def test_flattened_param_groups_lose_their_options():
    message = failure(variant(SOLUTION, INNER, 'inner = optimizer_class([p for g in mine for p in g["params"]], '
                              '**defaults)'))
    assert "AdamW over 3 param groups, step 1: embed after step()" in message
    assert "Your inner optimizer steps layers.1.weight (shape (8, 11)) with {" in message
    assert "'lr': 0.04054, 'weight_decay': 0.01}: keep each param group's options" in message


def test_a_frozen_parameter_with_an_owner_is_named():
    message = failure(variant(SOLUTION, 'for p in g["params"] if p.requires_grad]', 'for p in g["params"]]'))
    assert "the frozen parameter temperature (requires_grad=False) is in rank(s) [2]'s inner optimizer" in message


def test_a_forgotten_broadcast_names_the_stale_parameter_and_its_owner():
    message = failure(variant(SOLUTION, BROADCAST, "pass"))
    assert "AdamW over 3 param groups, step 1: embed after step()" in message
    assert "rank 2 owns and updated it, but the update never reached rank 0" in message


def test_unbalanced_shards_exceed_the_greedy_bound():
    # the parameter list cut in contiguous thirds: the big weights land together
    wrong = variant(SOLUTION, "for p in sorted(trainable, key=lambda p: -p.numel() * p.element_size()):",
                    "for i, p in enumerate(trainable):")
    message = failure(variant(wrong, "r = min(range(n), key=lambda q: load[q])", "r = i * n // len(trainable)"))
    assert "SGD over 3 param groups, step 1: rank 0 holds 576 B of the 704 B of optimizer state" in message
    assert "S/n + (1 − 1/n)·s_max = 448 B" in message and "least-loaded rank, largest first" in message


def test_an_all_reduce_inside_step_is_named():
    # values stay right (averaging averaged gradients changes nothing); the traffic does not
    message = failure(variant(SOLUTION, "self.optim.step()  ", "for p in trainable:\n"
                              "                dist.all_reduce(p.grad, group=group)\n"
                              "                p.grad /= n\n            self.optim.step()  "))
    assert "step() called ['all_reduce']: the gradients arrive already averaged" in message


def test_zero_grad_of_owned_parameters_only_is_named():
    message = failure(variant(SOLUTION, "for p in trainable:                    # every gradient, owned or not: "
                              "backward adds to them", "for p in [q for q in trainable if owner[id(q)] == me]:"))
    assert "AdamW over 3 param groups, step 2: after your zero_grad() embed still held last step's gradient" \
           in message


def test_a_broadcast_that_ignores_the_group_is_named():
    message = failure(variant(SOLUTION, BROADCAST, "dist.broadcast(p.detach(), src=src)"))
    assert "rank 1 (rank(s) [2] failed this check too): RMSprop over 2 param groups, group [1, 2], step 1" in message
    assert "dist.broadcast over ranks [0, 1, 2], but the group is [1, 2]: pass group=group" in message


def test_a_group_rank_as_broadcast_source_is_named():
    message = failure(variant(SOLUTION, "dist.get_global_rank(group, owner[id(p)])", "owner[id(p)]"))
    assert "group [1, 2], step 1: your code called dist.broadcast(..., src=0), but rank 0 is not in the group" \
           in message
    assert "src and dst are *global* ranks — dist.get_global_rank(group, r)" in message


def test_an_inner_optimizer_over_copies_is_named():
    message = failure(variant(SOLUTION, 'mine = [{**g, "params": [p for p in g["params"]',
                              'mine = [{**g, "params": [p.detach().clone().requires_grad_() for p in g["params"]'))
    assert "embed after step()" in message
    assert "tensor(s) that are not the model's parameters — build the inner optimizer over the very" in message


def test_a_hard_coded_class_is_named():
    message = failure(variant(SOLUTION, INNER, 'inner = torch.optim.AdamW([g for g in mine if g["params"]], '
                              'lr=defaults["lr"])'), seed=2)
    assert "Adam over 2 param groups: `.optim` is a AdamW, not the Adam you were asked to wrap" in message


FLAT = 'flat = [p for g in mine for p in g["params"]]'


def with_options(table: dict) -> object:
    """Groups flattened, except that options copied from failure messages are looked up by (shape, class)."""
    return variant(SOLUTION, INNER, f"{FLAT}\n    table = {table!r}\n"
                   "    inner = optimizer_class([{'params': [p], **table.get((tuple(p.shape), "
                   "optimizer_class.__name__), {})} for p in flat], **defaults)")


def named_options(message: str) -> dict:
    """{(shape, class): {lr, weight_decay}} of the parameter a failure message says lost its group's options."""
    found = re.search(r": (\w+) over .*?Your inner optimizer steps \S+ \(shape (\([\d, ]*\))\) with .*?, its param "
                      r"group asks (\{.*?\}):", message)
    if found is None:
        return {}
    asks = ast.literal_eval(found[3])
    return {(ast.literal_eval(found[2]), found[1]): {k: asks[k] for k in ("lr", "weight_decay")}}


def test_options_copied_from_one_seeds_messages_do_not_carry_to_another_seed():
    table = named_options(failure(with_options({}), seed=2))
    assert table
    again = grade(with_options(table), seed=2)
    assert named_options(again.message).keys() != table.keys()  # the table fixed the parameter it was copied from
    other = failure(with_options(table), seed=5)  # a fresh seed: other shapes, other options
    assert "its param group asks" in other and not named_options(other).keys() & table.keys()
