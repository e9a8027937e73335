"""Exercise 01's hint reads a wrong element through notebook 01's 2^r tags only when it is exactly a sum of some
ranks' inputs at one position; a scaled tensor (`tensor.mul_(2)`) is called scaled, not "the sum of rank [1]",
a value that is no such sum is said to be none, and a sum holding ranks outside the group says so (the group was
ignored). Two answers are graded on ranks (one launch each)."""
import torch
import torch.distributed as dist

from partrain_edu.grading import run_check
from partrain_edu.grading.checks.ring_all_reduce import ring_diagnosis, ring_input

N, NUMEL = 3, 12
GIVEN = {r: ring_input(NUMEL, r) for r in range(N)}  # element i of rank r: 2^r + 16·i
EXPECTED = sum(GIVEN.values())                         # element i: 7 + 48·i


def test_a_scaled_input_is_named_scaled_not_decoded_as_another_ranks_sum():
    # rank 0's 1 + 16i doubled is 2 + 32i: element 0's 2 is rank 1's input, but the answer added nothing
    text, named = ring_diagnosis(EXPECTED, GIVEN[0] * 2, GIVEN, 0)
    assert named and "rank(s)" not in text, text
    assert text == (". Element 0 holds 2, which is no sum of the ranks' inputs (expected 7): every element is 2× "
                    "this rank's own input — each element must be added to the other ranks' values, not scaled.")


def test_a_partial_sum_names_the_ranks_it_holds_and_the_ones_never_added():
    got = EXPECTED.clone()
    got[4:8] = GIVEN[0][4:8] + GIVEN[2][4:8]  # chunk 1 never received rank 1's part
    text, named = ring_diagnosis(EXPECTED, got, GIVEN, 0)
    assert not named and text == ". Element 4 holds the sum of rank(s) [0, 2] (rank(s) [1] never added)."
    got = EXPECTED.clone()
    got[0] = EXPECTED[5]  # a whole sum, from another position
    text, _ = ring_diagnosis(EXPECTED, got, GIVEN, 1)
    assert text == ". Element 0 holds the sum of rank(s) [0, 1, 2] of element 5: a chunk landed in the wrong place."


def test_the_position_is_read_back_whatever_each_rank_was_offset_by():
    given = {r: ring_input(NUMEL, r, offset) for r, offset in enumerate((40, 3, 77))}
    expected = sum(given.values())
    got = expected.clone()
    got[2] = given[0][9] + given[1][9]  # ranks 0 and 1 only, of element 9
    text, named = ring_diagnosis(expected, got, given, 2)
    assert not named and text == (". Element 2 holds the sum of rank(s) [0, 1] (rank(s) [2] never added) of "
                                  "element 9: a chunk landed in the wrong place.")


def test_a_sum_over_ranks_outside_the_group_names_them_and_the_cause():
    given = {r: ring_input(NUMEL, r, 5 * r) for r in range(4)}
    members = (1, 3)
    expected = given[1] + given[3]
    text, named = ring_diagnosis(expected, sum(given.values()), given, 3, members)  # the whole world's sum
    assert named and text.startswith(". Element 0 holds the sum of rank(s) [0, 1, 2, 3], but rank(s) [0, 2] are not "
                                     "in this group [1, 3]"), text
    assert "dist.get_rank(group)" in text and "pass group=" in text


def test_a_value_that_is_no_subset_sum_is_said_to_be_none():
    # never written; not a whole number; all three ranks' tags but at position 12 of a 12-element tensor
    for value in (0.0, 3.5, 7.0 + 48 * 12):
        got = EXPECTED.clone()
        got[2] = value
        text, named = ring_diagnosis(EXPECTED, got, GIVEN, 0)
        assert not named and text == (f". Element 2 holds {value:g}, which is no sum of the ranks' inputs (expected "
                                      "103): a ring only adds received chunks and copies them, so something else "
                                      "changed this value."), text


def ring_scaled(tensor, group=None):
    return tensor.mul_(2)  # "all-reduced" without talking to anyone


def ring_reduce_scatter_only(tensor, group=None):
    # a correct reduce-scatter, then no all-gather: each rank holds the full sum of one chunk only
    n, me = dist.get_world_size(group), dist.get_rank(group)
    flat = tensor.view(-1)
    size, extra = divmod(flat.numel(), n)
    starts = [k * size + min(k, extra) for k in range(n + 1)]
    for step in range(n - 1):
        send, recv = (me - step - 1) % n, (me - step - 2) % n
        incoming = torch.empty(starts[recv + 1] - starts[recv], dtype=flat.dtype)
        works = []
        if incoming.numel():
            works.append(dist.irecv(incoming, group=group, group_src=(me - 1) % n))
        if starts[send + 1] > starts[send]:
            works.append(dist.isend(flat[starts[send]:starts[send + 1]], group=group, group_dst=(me + 1) % n))
        for work in works:
            work.wait()
        flat[starts[recv]:starts[recv + 1]] += incoming
    return tensor


def test_graded_on_ranks_mul_2_is_scaled_and_reduce_scatter_only_is_partial():
    result = run_check("ring_all_reduce", ring_scaled, timeout=60, seed=3)
    assert not result.passed
    assert "which is no sum of the ranks' inputs" in result.message, result.message
    assert "every element is 2× this rank's own input" in result.message, result.message
    assert "sum of rank(s)" not in result.message and "Hint: group rank g sends" not in result.message
    result = run_check("ring_all_reduce", ring_reduce_scatter_only, timeout=60, seed=3)
    assert not result.passed
    assert "on the default group (4 ranks)" in result.message and "holds the sum of rank(s)" in result.message
    assert "never added)" in result.message and "Hint: group rank g sends" in result.message, result.message


def test_a_failed_check_shows_whole_words_on_lines_a_cell_can_hold():
    from partrain_edu.grading.registry import WRAP_COLUMNS, CheckFailed

    long_line = "rank 0 waits in recv while rank 1 waits in recv too: nobody sends — " * 4
    failed = CheckFailed(f"check 'ring_all_reduce' failed:\n  {long_line.strip()}\n\n  next line")
    rendered = failed._render_traceback_()
    assert max(map(len, rendered)) <= WRAP_COLUMNS, rendered
    assert " ".join(part.strip() for part in rendered[1:-2]) == long_line.strip()  # whole words, none lost
    assert all(part.startswith("  ") for part in rendered[1:-2]) and rendered[-2:] == ["", "  next line"], rendered
