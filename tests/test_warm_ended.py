"""Warm pool (issue 30, L3): a cell in which one rank ends while another waits in a collective for it is
stopped as soon as the call records say so — the one-shot runs' diagnosis, not the cell's timeout."""
import pytest

from test_warm import failing

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("code, waits", [
    ("x = torch.ones(3)\nif rank == 0:\n    dist.all_reduce(x)\nelse:\n    print('done early')", "all_reduce"),
    ("import sys\nif rank == 1:\n    sys.exit(0)\ndist.barrier()", "barrier"),
])
def test_a_rank_that_ended_the_cell_is_named_before_the_timeout(code, waits):
    error, elapsed = failing(code, timeout=60)
    text = str(error)
    print(f"stopped after {elapsed:.1f} s: {text[:160]}")   # the benchmark: was 60 s, the collective timeout
    assert not error.timed_out and error.rank == 1, text
    assert text.startswith("rank 1 ended after 0 collectives while rank 0 waits in its 1st"), text
    assert waits in text and "`%dist restart`" in text
