"""Exercise 04, a ZeRO-1 step, graded on 4 ranks (the default group, then the groups of a 3 + 1 and a 2 + 2 split of
the ranks; P, steps, lr and β drawn per run): the solution passes on two seeds, and so does one written with the
deprecated names reduce_scatter_tensor / all_gather_into_tensor; wrong answers fail naming the earliest wrong
quantity — every rank keeping the full momentum (right values, ZeRO-1's bytes and collectives, 4× the state), the
group ignored, lr and β hard-coded to the defaults, param or momentum rebound instead of updated in place; and an
answer that replays the momentum other runs' messages printed fails on a new run. One torchrun launch per graded
answer and seed, each seed fixed. In-process (no launch), the verify half names, on a sub-group without rank 0, a
missing average, the other group rank's shard (by its global rank), an all-reduce by its bytes and by its name,
and state kept between calls."""
import json
import re

import pytest

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.checks.zero1_optimizer import RANKS, rounds, setup_of, trajectory
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import tensor, verify
from partrain_edu.grading.runner import spec_of

SOLUTION = solution_source("04_zero1_optimizer", "zero1_step")
GATHER = "dist.all_gather_single(param, mine.clone(), group=group)"
FULL_MOMENTUM = '''def zero1_step(param, grad, momentum, group=None, lr=0.1, beta=0.9):
    # right values, ZeRO-1's bytes and collectives (the averaged gradient gathered instead of the parameters), but
    # every rank keeps and updates the full momentum between calls
    n, me = dist.get_world_size(group), dist.get_rank(group)
    shard = param.numel() // n
    state = zero1_step.__dict__.setdefault((param.numel(), n), torch.zeros_like(param))
    mine = torch.empty(shard)
    dist.reduce_scatter_single(mine, grad, group=group)
    full = torch.empty_like(param)
    dist.all_gather_single(full, mine / n, group=group)
    state.mul_(beta).add_(full)
    param -= lr * state
    momentum.copy_(state[me * shard:(me + 1) * shard])
'''



def failure(source: Source, seed: int) -> str:
    result = run_check("zero1_step", source, seed=seed, timeout=60)
    assert not result.passed
    assert result.message.count("\n") < 12 and "partrain_edu" not in result.message  # one readable verdict
    return result.message


@pytest.mark.parametrize("seed", [1, 2])
def test_the_solution_passes(seed):
    result = run_check("zero1_step", SOLUTION, seed=seed, timeout=60)
    assert result.passed, result.message


def test_the_deprecated_names_pass_too():
    older = variant(variant(SOLUTION, "dist.reduce_scatter_single(", "dist.reduce_scatter_tensor("),
                    "dist.all_gather_single(", "dist.all_gather_into_tensor(")
    result = run_check("zero1_step", older, seed=3, timeout=60)
    assert result.passed, result.message


@pytest.mark.parametrize("source, words", [
    (Source("zero1_step", FULL_MOMENTUM),
     ["the default group (4 ranks; P = ", "step 1: between calls your function keeps 48 B of tensors besides the "
      "`momentum` shard", "(first: zero1_step.__dict__[(12, 4)], 48 B)", "ZeRO-1 keeps on each rank only its 1/n"]),
    (Source("zero1_step", SOLUTION.text.replace("dist.get_world_size(group), dist.get_rank(group)",
                                                "dist.get_world_size(), dist.get_rank()")
            .replace(", group=group)", ")")),
     ["raised RuntimeError", "dist.reduce_scatter_single(g, grad)"]),
    (variant(variant(SOLUTION, "momentum.mul_(beta)", "momentum.mul_(0.9)"), "mine -= lr", "mine -= 0.1"),
     ["the default group (4 ranks; P = 12, lr = 0.069, β = 0.5), step 1: parameters after the step",
      "That is lr = 0.1, the default: step with the `lr` you are given."]),
    (variant(SOLUTION, GATHER, "full = torch.empty_like(param)\n"
                               "    dist.all_gather_single(full, mine.clone(), group=group)\n    param = full"),
     ["step 1: parameters after the step", "Wrong entries belong to the shard(s) of group rank(s) [1, 2, 3], and "
      "they hold what they held before the step", "into `param` itself (in place)"]),
], ids=["full-momentum", "ignores-group", "default-lr-beta", "param-rebound"])
def test_a_wrong_answer_fails_naming_the_earliest_wrong_quantity(source, words):
    message = failure(source, seed=5)
    for word in words:
        assert word in message, (word, message)


# --- replay: the momentum printed by the messages of some runs, written back on another -----------------------

REBOUND = variant(SOLUTION, "momentum.mul_(beta).add_(g)", "momentum = momentum * beta + g")  # not in place
PRINTED = re.compile(r"\(4 ranks; P = (\d+), .*?: momentum shard of rank 0 .*?; expected \[([^\]]*)\], got")


@pytest.fixture(scope="module")
def printed() -> dict:
    """(P, group size, group rank) -> rank 0's momentum after step 1 as the rebound answer's failures printed it."""
    table = {}
    for seed in (31, 32):
        message = failure(REBOUND, seed)
        assert "It is what it was before the step: update `momentum` in place" in message, message
        numel, values = PRINTED.search(message).groups()
        table[(int(numel), RANKS, 0)] = [float(v) for v in values.replace("…", "").split(",") if v.strip()]
    return table


def test_an_answer_replaying_printed_momentum_fails_on_another_run(printed):
    seed = next(s for s in range(100, 10_000) if (rounds(s)[0][0].numel, RANKS, 0) in printed)  # a P it "knows"
    replay = ("def zero1_step(param, grad, momentum, group=None, lr=0.1, beta=0.9):\n"
              "    # the momentum other runs' messages printed, by P, group size and group rank\n"
              f"    table = {printed!r}\n"
              "    known = table.get((param.numel(), dist.get_world_size(group), dist.get_rank(group)), [])\n"
              "    momentum[:len(known)] = torch.tensor(known)\n")
    message = failure(Source("zero1_step", replay), seed)
    assert "step 1: momentum shard of rank 0" in message and "values differ" in message, message
    assert "It is what it was before the step" not in message, message  # rank 0 did write the replayed values


# --- the verify half alone, on observations made in-process (no ranks) -------------------------------------

def honest(seed: int) -> list:
    """Every rank's observations of a correct ZeRO-1 step in run `seed`, from the grader's own trajectory."""
    ranks = []
    for me in range(RANKS):
        calls = []
        for rnd in rounds(seed):
            s = setup_of(rnd, me)
            g, n = s.members.index(me), len(s.members)
            calls.append([{"momentum": tensor(shards[g]), "param": tensor(param), "kept": [], "bytes": {}, "peers": {},
                           "ops": {"reduce_scatter_single": 1, "all_gather_single": 1},
                           "sent": 2 * (n - 1) * s.numel * 4 // n} for shards, param in trajectory(s, s.lr, s.beta)])
        ranks.append(calls)
    return ranks


def test_verify_names_a_missing_average_another_shard_and_an_all_reduce():
    spec, seed = spec_of("zero1_step", 1), 5
    assert verify(spec, json.dumps(honest(seed)), seed) == []
    k = 2  # the 2 + 2 split: one pair without rank 0
    pair = next(s.members for s in rounds(seed)[k] if 0 not in s.members)
    s = setup_of(rounds(seed)[k], pair[0])
    shards, _ = trajectory(s, s.lr, s.beta)[0]
    S = 4 * s.numel
    where = f"rank {pair[0]}: the group of rank(s) {list(pair)} (2 rank(s); P = {s.numel}"
    cases = [  # (what the pair's first rank reports after step 1 of round k instead, words)
        ({"momentum": tensor(2 * shards[0])}, "Missing average: divide the reduced gradient by the group's size 2."),
        ({"momentum": tensor(shards[1])}, f"That is group rank 1's shard (rank {pair[1]}): group rank g owns entries "
                                          "[g·P/n, (g+1)·P/n), g = dist.get_rank(group)."),
        ({"ops": {"all_reduce": 1, "all_gather_single": 1}, "sent": S + S // 2},
         f"step 1: sent {S + S // 2} bytes; ZeRO-1 sends {S} = 2(n−1)/n·S, n the group's size (reduce-scatter the "
         "gradients, all-gather the parameters) — an all-reduce of the gradients sends twice"),
        ({"ops": {"all_reduce": 1}}, "you called ['all_reduce']; ZeRO-1 reduce-scatters the gradients"),
        ({"kept": [["zero1_step.__dict__['m']", S]]}, f"between calls your function keeps {S} B of tensors besides the "
                                                      f"`momentum` shard it is given (first: zero1_step.__dict__['m'], "
                                                      f"{S} B)"),
    ]
    for change, words in cases:
        spoiled = honest(seed)
        spoiled[pair[0]][k][0].update(change)
        problems = verify(spec, json.dumps(spoiled), seed)
        assert problems and problems[0].startswith(where) and words in problems[0], (words, problems)


def test_every_run_draws_a_group_without_rank_0_and_p_divisible_by_every_group():
    for seed in range(50):
        plan = rounds(seed)
        assert plan[0][0].members == tuple(range(RANKS)) and len(plan) == 3
        assert any(0 not in s.members and len(s.members) > 1 for rnd in plan for s in rnd)
        assert all(s.numel % len(s.members) == 0 and 2 <= s.steps <= 4 for rnd in plan for s in rnd)
    assert len({tuple((s.numel, s.lr, s.beta) for rnd in rounds(seed) for s in rnd) for seed in range(50)}) == 50
