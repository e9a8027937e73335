"""The one rank grid (`theory.grid`) and what must agree with it: the grader of exercise 7 and the planner's
links (the groups a job builds from it, by hand and through `init_device_mesh`: tests/test_hybrid.py)."""
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from partrain_edu.grading.checks.placement_3d import expected_groups, inside_node
from partrain_edu.theory import grid
from partrain_edu.theory.planner import link_of

SIZES = {"pp": 2, "dp": 2, "tp": 2}


def test_megatron_order_pipeline_outermost_tensor_innermost():
    assert [tuple(grid.coordinates(r, SIZES).values()) for r in range(8)] == list(itertools.product(range(2), repeat=3))
    assert grid.group_ranks("tp", SIZES) == [[0, 1], [2, 3], [4, 5], [6, 7]]     # neighbours: one node's GPUs
    assert grid.group_ranks("dp", SIZES) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert grid.group_ranks("pp", SIZES) == [[0, 4], [1, 5], [2, 6], [3, 7]]     # the farthest apart
    # picotron's order puts data parallelism outermost: rank 5 is another replica's stage, not stage 1
    assert grid.coordinates(5, SIZES, order=("dp", "pp", "tp")) == {"dp": 1, "pp": 0, "tp": 1}


@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4), st.data())
def test_rank_of_inverts_coordinates_and_groups_partition_the_world(pp, dp, tp, data):
    sizes = {"pp": pp, "dp": dp, "tp": tp}
    rank = data.draw(st.integers(0, pp * dp * tp - 1))
    assert grid.rank_of(grid.coordinates(rank, sizes), sizes) == rank
    for dim in grid.ORDER:
        groups = grid.group_ranks(dim, sizes)
        assert sorted(r for g in groups for r in g) == list(range(pp * dp * tp))
        assert all(len(g) == sizes[dim] and max(g) - min(g) < grid.block(dim, sizes) for g in groups)


def test_exercise_7_grader_and_planner_use_the_same_grid():
    assert expected_groups("dp", dp=2, tp=4, pp=1) == [[0, 4], [1, 5], [2, 6], [3, 7]]  # dp ranks tp apart
    assert expected_groups("pp", dp=2, tp=1, pp=4) == [[0, 2, 4, 6], [1, 3, 5, 7]]      # pp ranks tp·dp apart
    # 4 GPUs per node: one node holds a tp group (2 ranks) and a dp group's block (4); pp crosses nodes
    assert [link_of(d, SIZES, 4, "infiniband") for d in ("tp", "dp", "pp")] == ["nvlink", "nvlink", "infiniband"]
    for dp, tp, pp, per_node in [(2, 2, 2, 4), (4, 8, 2, 8), (2, 4, 8, 8), (9, 8, 4, 72)]:
        sizes = {"pp": pp, "dp": dp, "tp": tp}
        inside = inside_node(dp, tp, pp, per_node)
        assert [link_of(d, sizes, per_node, "infiniband") == "nvlink" for d in ("tp", "dp", "pp")] == \
            [inside[d] for d in ("tp", "dp", "pp")]


def test_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="outside a world of 8 ranks"):
        grid.coordinates(8, SIZES)
    with pytest.raises(ValueError, match="must name exactly pp, dp, tp"):
        grid.coordinates(0, {"dp": 2, "tp": 2})
    with pytest.raises(ValueError, match="tp must be a positive whole number"):
        grid.group_ranks("tp", {"pp": 1, "dp": 1, "tp": 0})
