"""Exercise 01, the ring all-reduce, graded on 4 ranks (the default group, then the groups of a 3 + 1 and a 2 + 2
split of the ranks, tensor lengths drawn per run): the solution passes on two seeds; wrong answers fail naming the
earliest wrong quantity — a sum returned in a new tensor (not in place), the group ignored, neighbours named by
group rank in the global `src=`/`dst=` (the old solution), the wrong direction, chunks numel // n long, and the sums
the old check printed (3 ranks, lengths 12, 7, 2) written without talking to anyone; and an answer that replays the
values other runs' messages printed fails on a new run. One torchrun launch per graded answer and seed, each seed
fixed. In-process (no launch), the verify half judges a sub-group's neighbours, bytes and collectives on honest
observations spoiled one field at a time: a neighbour outside the group, the whole tensor sent once more, an
all-reduce."""
import json
import re

import pytest

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.checks.ring_all_reduce import RANKS, inputs, rounds
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import verify
from partrain_edu.grading.runner import spec_of
from partrain_edu.parallel.ring import ring_bytes_sent_by

SOLUTION = solution_source("01_ring_all_reduce", "ring_all_reduce")
ADDRESSED = ("group=group, group_src=left", "group=group, group_dst=right")  # the solution's group-rank peers
OLD_SUMS = '''def ring_all_reduce(tensor, group=None):
    # the sums the old check printed (3 ranks, element i = 7 + 24·i), written without talking to anyone
    tensor.copy_(7 + 24 * torch.arange(tensor.numel()))
    return tensor
'''


def failure(source: Source, seed: int) -> str:
    result = run_check("ring_all_reduce", source, seed=seed, timeout=60)
    assert not result.passed
    assert result.message.count("\n") < 12 and "partrain_edu" not in result.message  # one readable verdict
    return result.message


@pytest.mark.parametrize("seed", [1, 2])
def test_the_solution_passes(seed):
    result = run_check("ring_all_reduce", SOLUTION, seed=seed, timeout=60)
    assert result.passed, result.message


def uneven_chunks() -> Source:
    """Every chunk numel // n long: the last numel % n elements are never reduced."""
    return variant(SOLUTION, "bounds = chunk_bounds(flat.numel(), n)",
                   "bounds = [(k * (flat.numel() // n), (k + 1) * (flat.numel() // n)) for k in range(n)]")


@pytest.mark.parametrize("source, words", [
    (variant(variant(SOLUTION, "flat = tensor.view(-1)", "flat = tensor.clone().view(-1)"), "return tensor",
             "return flat"),
     ["on the default group (4 ranks): `tensor` still holds this rank's input after your function returned — the "
      "sum came back in a new tensor instead", "The all-reduce is in place"]),
    (Source("ring_all_reduce", SOLUTION.text.replace("dist.get_world_size(group), dist.get_rank(group)",
                                                     "dist.get_world_size(), dist.get_rank()")
            .replace(ADDRESSED[0], "src=left").replace(ADDRESSED[1], "dst=right")),
     ["on the group of rank(s)", "holds the sum of rank(s) [0, 1, 2, 3], but rank(s)", "are not in this group",
      "dist.get_rank(group)"]),
    # which rank's error comes first is a race (rank 0's ValueError "Global rank 1 is not part of group", or a
    # neighbour's Gloo error): the learner's own line is always shown
    (variant(variant(SOLUTION, ADDRESSED[0], "src=left, group=group"), ADDRESSED[1], "dst=right, group=group"),
     ["raised", "your ring_all_reduce, line 12, in exchange", "dist.irecv(incoming, src=left, group=group)"]),
    (variant(variant(SOLUTION, "group_src=left", "group_src=right"), "group_dst=right", "group_dst=left"),
     ["bytes arrived where the receiving call expected", "Likely: a rank sends to its left neighbour or receives "
      "from its right one"]),
    (uneven_chunks(), ["on the default group (4 ranks)", "Hint: group rank g sends", "(first numel % n chunks one "
                       "longer)"]),
], ids=["not-in-place", "ignores-group", "global-src-dst", "wrong-neighbour", "uneven-chunks"])
def test_a_wrong_answer_fails_naming_the_earliest_wrong_quantity(source, words):
    message = failure(source, seed=7)
    for word in words:
        assert word in message, (word, message)


# --- replay: values printed by the messages of some runs, written back on another ---------------------------

PRINTED = re.compile(r"length (\d+) on the default group \(4 ranks\): .*?; expected \[([^\]]*)\], got")


@pytest.fixture(scope="module")
def printed() -> dict:
    """(length, group size) -> the sums the old-sums answer's failures printed, for two seeds."""
    table = {}
    for seed in (21, 22):
        message = failure(Source("ring_all_reduce", OLD_SUMS), seed)
        assert "which is no sum of the ranks' inputs" in message, message
        numel, values = PRINTED.search(message).groups()
        table[(int(numel), RANKS)] = [float(v) for v in values.replace("…", "").split(",") if v.strip()]
    return table


def test_an_answer_replaying_printed_sums_fails_on_another_run(printed):
    seed = next(s for s in range(100, 10_000) if (rounds(s)[0].numel, RANKS) in printed)  # a length it "knows"
    replay = ("def ring_all_reduce(tensor, group=None):\n"
              "    # the sums other runs' messages printed, by length and group size\n"
              f"    table = {printed!r}\n"
              "    known = table.get((tensor.numel(), dist.get_world_size(group)), [])\n"
              "    tensor.view(-1)[:len(known)] = torch.tensor(known)\n"
              "    return tensor\n")
    message = failure(Source("ring_all_reduce", replay), seed)
    assert f"length {rounds(seed)[0].numel} on the default group (4 ranks)" in message, message
    assert "values differ" in message, message


# --- the verify half alone, on observations made in-process (no ranks) -------------------------------------

def honest(seed: int) -> list:
    """Every rank's observations of a correct ring in run `seed`: the group's sums, its neighbours, its bytes."""
    ranks = []
    for me in range(RANKS):
        calls = []
        for rnd in rounds(seed):
            members, given = rnd.group_of(me), inputs(rnd)
            g, n = members.index(me), len(members)
            total = sum(given[r] for r in members).tolist()
            calls.append({"out": {"shape": [rnd.numel], "values": total}, "returned": {"shape": [rnd.numel],
                          "values": total}, "ops": {"isend": 2, "irecv": 2}, "bytes": {},
                          "sent": ring_bytes_sent_by(g, rnd.numel, 4, n),
                          "peers": {"isend": [members[(g + 1) % n]], "irecv": [members[(g - 1) % n]]} if n > 1 else {}})
        ranks.append(calls)
    return ranks


def test_verify_takes_neighbours_and_bytes_from_the_group():
    spec, seed = spec_of("ring_all_reduce", 1), 7
    assert verify(spec, json.dumps(honest(seed)), seed) == []
    k, rnd = next((k, r) for k, r in enumerate(rounds(seed)) if len(r.groups[-1]) == 2)  # the 2 + 2 split
    pair = rnd.groups[-1]  # neither member is rank 0
    where = f"rank {pair[0]}: length {rnd.numel} on the group of rank(s) {list(pair)}"
    cases = [  # (what a rank of the pair reports in round k instead, words)
        ({"peers": {"isend": [0], "irecv": [pair[1]]}},  # rank 0 is in the other group
         f"sent to rank(s) [0] and received from [{pair[1]}]; in a ring each rank sends only to its right "
         f"neighbour in the group (rank {pair[1]})"),
        ({"sent": ring_bytes_sent_by(0, rnd.numel, 4, 2) + 4 * rnd.numel},  # the whole tensor once more
         f"the ring sends exactly {ring_bytes_sent_by(0, rnd.numel, 4, 2)} (2(n−1)/n·S with S = {4 * rnd.numel} B "
         "and n the group's size: every chunk but one per phase). More means whole tensors or extra chunks travel."),
        ({"ops": {"all_reduce": 1}}, "you called ['all_reduce']; build the all-reduce from isend/irecv"),
    ]
    for change, words in cases:
        spoiled = honest(seed)
        spoiled[pair[0]][k].update(change)
        problems = verify(spec, json.dumps(spoiled), seed)
        assert problems and problems[0].startswith(where) and words in problems[0], (words, problems)


def test_every_run_draws_uneven_short_and_divisible_lengths_and_a_group_without_rank_0():
    for seed in range(50):
        plan = rounds(seed)
        assert plan[0].groups == (tuple(range(RANKS)),) and len(plan) == 9
        assert any(0 not in g and len(g) > 1 for rnd in plan for g in rnd.groups)
        for start in (0, 3, 6):
            n = max(len(g) for g in plan[start].groups)
            lengths = [rnd.numel for rnd in plan[start:start + 3]]
            kinds = [sum(k < n for k in lengths), sum(k > n and k % n > 0 for k in lengths),
                     sum(k % n == 0 for k in lengths)]
            assert kinds == [1, 1, 1], (seed, n, lengths)
    assert len({tuple(r.numel for r in rounds(s)) for s in range(50)}) > 40  # seldom the same lengths twice


def test_a_one_element_result_is_read_as_the_sum_it_holds_not_as_a_scaled_input():
    # An examiner's answer left rank 1's input alone in a length-1 tensor: one element is a multiple of anything,
    # so the "scaled" rule must not fire; the decoding names the ranks summed instead.
    from partrain_edu.grading.checks.ring_all_reduce import ring_diagnosis, ring_input

    given = {r: ring_input(1, r, offset=10 * r + 3) for r in range(4)}
    expected = sum(given.values())
    text, named = ring_diagnosis(expected, given[1].clone(), given, 0)
    assert "holds the sum of rank(s) [1]" in text and "scaled" not in text, text
    longer = {r: ring_input(3, r, offset=10 * r + 3) for r in range(4)}
    scaled = ring_diagnosis(sum(longer.values()), 3 * longer[0], longer, 0)[0]  # 3 × rank 0's: a sum of no ranks
    assert "every element is 3× this rank's own input" in scaled, scaled
