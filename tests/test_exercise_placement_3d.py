"""Exercise 7, 3D placement (the solution is graded in test_exercises; init_device_mesh's route here): wrong answers
are caught with a message naming the mistake. `groups_inside_node` is in-process; `build_groups` is one 8-rank
launch per case (about 10–20 s each on an idle 2-core machine, most of it eight processes importing torch)."""
from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.learner_code import Source

NOTEBOOK = "07_3d_parallel"


def live(source: Source):
    """The function `source` defines: an in-process check calls the learner's function itself."""
    namespace = {}
    exec(compile(source.text, f"<{source.name}>", "exec"), namespace)
    return namespace[source.name]


INSIDE = solution_source(NOTEBOOK, "groups_inside_node")
BUILD = solution_source(NOTEBOOK, "build_groups")
MESH = Source("build_groups", '''def build_groups(dp, tp, pp):
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    return {dim: mesh[dim].get_group() for dim in ("tp", "dp", "pp")}
''')


def inside_by_size(dp, tp, pp, gpus_per_node):  # the trap: a group that fits in a node by size is not in one
    return {"tp": tp <= gpus_per_node, "dp": dp <= gpus_per_node, "pp": pp <= gpus_per_node}


def test_inside_node_solution_passes():
    result = run_check("groups_inside_node", live(INSIDE))
    assert result.passed, result.message


def test_inside_node_judged_by_group_size_is_caught():
    message = run_check("groups_inside_node", inside_by_size).message
    assert "dp=4, tp=8, pp=2 on 8-GPU nodes (64 GPUs): dp groups expected crossing nodes, got inside" in message
    assert "e.g. dp group [0, 8, 16, 24] spans nodes [0, 1, 2, 3]" in message
    assert "dp ranks are tp = 8 apart" in message, message


def test_inside_node_with_dp_outermost_is_caught():
    # picotron's order (dp outermost, then pp, then tp): on tp 4 × dp 2 × pp 8 the dp groups leave the node
    picotron = variant(INSIDE, '"dp": tp, "pp": tp * dp', '"dp": tp * pp, "pp": tp')
    message = run_check("groups_inside_node", live(picotron)).message
    assert "dp=2, tp=4, pp=8 on 8-GPU nodes (64 GPUs): dp groups expected inside one node, got crossing" in message
    assert "is all on node 7" in message and "stretches over tp·dp = 8 consecutive ranks" in message, message


def test_inside_node_with_tp_and_dp_swapped_is_caught():
    swapped = variant(INSIDE, '{"tp": 1, "dp": tp,', '{"tp": dp, "dp": 1,')
    message = run_check("groups_inside_node", live(swapped)).message
    assert "tp groups expected inside one node, got crossing" in message
    assert "tp ranks are adjacent (stride 1)" in message, message


def test_inside_node_returning_a_list_is_caught():
    message = run_check("groups_inside_node", lambda dp, tp, pp, g: ["tp"]).message
    assert "expected a dict {'tp': bool, 'dp': bool, 'pp': bool}" in message and "got ['tp']" in message, message


def test_build_groups_with_init_device_mesh_passes():
    result = run_check("build_groups", MESH, timeout=120)
    assert result.passed, result.message


def test_build_groups_with_tp_and_dp_swapped_names_the_bits():
    swapped = variant(BUILD, '{"tp": 1, "dp": tp,', '{"tp": dp, "dp": 1,')
    message = run_check("build_groups", swapped, timeout=120).message
    assert ("dp=2, tp=2, pp=2: your tp group on rank 0 summed ranks {0, 2} (bits 0b101); expected {0, 1}: "
            "tp ranks are adjacent") in message
    assert "{0, 2} is a dp group: tp and dp are swapped in your order" in message, message


def test_build_groups_with_pp_innermost_is_caught():
    pp_inner = variant(MESH, '(pp, dp, tp), mesh_dim_names=("pp", "dp", "tp")',
                       '(tp, dp, pp), mesh_dim_names=("tp", "dp", "pp")')
    message = run_check("build_groups", pp_inner, timeout=120).message
    assert "your tp group on rank 0 summed ranks {0, 4} (bits 0b10001); expected {0, 1}" in message
    assert "{0, 4} is a pp group: tp and pp are swapped" in message and "(pp, dp, tp)" in message, message


def test_build_groups_only_by_their_members_ends_in_the_deadlock_hint():
    # Only the members call new_group: the ranks number their groups differently and wait on each other in
    # Gloo's rendezvous until the launcher's limit; kept short, as the hang is the whole test.
    members_only = variant(BUILD, "            group = dist.new_group(ranks)  # collective: every rank, every group, "
                           "same order\n            if me in ranks:\n",
                           "            if me in ranks:\n                group = dist.new_group(ranks)\n")
    message = run_check("build_groups", members_only, timeout=20).message
    assert "timed out" in message or "the ranks did not build the same groups" in message, message
    assert "dist.new_group is collective: every rank must call it for every group" in message, message

