"""Exercise 7, 3D placement: the solutions pass on several seeds (`build_groups` with new_group and with
init_device_mesh); every run's jobs and grids tell each misreading of the rank order apart; wrong answers fail
with a message naming the mistake and, where every answer agrees, its cause (group size taken for placement, a
fixed order, the order read outermost first, two sizes swapped); a table of the answers the messages of a few
runs named fails the next run. `groups_inside_node` is in-process; each `build_groups` run is one 8-rank launch
(about 4–10 s on an idle 2-core machine, most of it eight processes importing torch)."""
import json
import re

from exercise_sources import solution_source, variant
from partrain_edu.grading import run_check
from partrain_edu.grading.checks.placement_3d import DIMS, ORDERS, expected_groups, grids, inside_node, node_jobs
from partrain_edu.grading.checks.placement_3d_reference import MISREADINGS, _groups
from partrain_edu.grading.learner_code import Source
from partrain_edu.grading.observations import verify
from partrain_edu.grading.runner import spec_of

NOTEBOOK = "07_3d_parallel"


def live(source: Source):
    """The function `source` defines: an in-process check calls the learner's function itself."""
    namespace = {}
    exec(compile(source.text, f"<{source.name}>", "exec"), namespace)
    return namespace[source.name]


INSIDE = solution_source(NOTEBOOK, "groups_inside_node")
BUILD = solution_source(NOTEBOOK, "build_groups")
MESH = Source("build_groups", '''def build_groups(dp, tp, pp, order):
    names = tuple(reversed(order.split("-")))  # init_device_mesh takes the shape outermost first
    size = {"tp": tp, "dp": dp, "pp": pp}
    mesh = init_device_mesh("cpu", tuple(size[d] for d in names), mesh_dim_names=names)
    return {dim: mesh[dim].get_group() for dim in ("tp", "dp", "pp")}
''')


def inside_by_size(dp, tp, pp, gpus_per_node, order):  # the trap: a group that fits in a node by size is not in one
    return {"tp": tp <= gpus_per_node, "dp": dp <= gpus_per_node, "pp": pp <= gpus_per_node}


def failure(fn, seed=3) -> str:
    result = run_check("groups_inside_node", fn, seed=seed)
    assert not result.passed
    return result.message


def test_inside_node_solution_passes_on_several_seeds():
    for seed in (1, 2, 3, 4):
        result = run_check("groups_inside_node", live(INSIDE), seed=seed)
        assert result.passed, result.message


def test_every_run_tells_the_orders_apart():
    for seed in range(8):
        jobs = node_jobs(seed)
        truth = [inside_node(*job) for job in jobs]
        assert all({t[d] for t in truth} == {True, False} for d in DIMS)   # each dimension inside and crossing
        assert {job[4] for job in jobs} >= {"tp-dp-pp", "tp-pp-dp"}
        for fixed in ORDERS:   # an answer for one order only fails some job
            assert any(inside_node(*job[:4], fixed) != t for job, t in zip(jobs, truth, strict=True))
        drawn = grids(seed)
        assert len({g[:3] for g in drawn}) == 3
        for misread in MISREADINGS:
            assert any(_groups(*misread(*g)) != _groups(*g) for g in drawn)
    assert len({job for seed in range(8) for job in node_jobs(seed)}) > 60   # runs rarely share a job


def test_inside_node_judged_by_group_size_is_caught_with_its_cause():
    message = failure(inside_by_size)
    assert re.search(r"groups_inside_node\(\d+, \d+, \d+, \d+, '[a-z-]+'\) \(dp=", message)
    assert re.search(r"(tp|dp|pp) groups expected crossing nodes, got inside: e\.g\. \1 group \[[0-9, …]+\] spans "
                     r"nodes \[", message), message
    assert "Your answers are 'size ≤ gpus_per_node' in every job" in message


def test_inside_node_with_a_fixed_order_or_the_order_read_outermost_first_is_caught():
    fixed = variant(INSIDE, 'order.split("-")', '"tp-dp-pp".split("-")')
    message = failure(live(fixed))
    assert "Hint: in order '" in message and "(innermost first)" in message
    assert "Your answers follow the order 'tp-dp-pp' in every job, whatever `order` says." in message
    reversed_order = variant(INSIDE, 'order.split("-")', 'reversed(order.split("-"))')
    assert "read every order outermost first in every job: `order` lists the innermost first" in \
        failure(live(reversed_order))


def test_inside_node_with_tp_and_dp_sizes_swapped_names_the_spacing_but_no_cause():
    swapped = variant(INSIDE, 'size = {"tp": tp, "dp": dp, "pp": pp}', 'size = {"tp": dp, "dp": tp, "pp": pp}')
    message = failure(live(swapped))
    assert re.search(r"(tp|dp|pp) (is innermost: \1 ranks are adjacent|ranks are [a-z·]+ = \d+ apart)", message)
    assert "Your answers" not in message, message


def test_inside_node_of_the_wrong_form_or_without_order_fails():
    assert "expected a dict {'tp': bool, 'dp': bool, 'pp': bool}" in failure(lambda dp, tp, pp, g, order: ["tp"])
    assert "takes 4 positional arguments but 5 were given" in failure(lambda dp, tp, pp, g: {})


def test_a_table_of_inside_node_answers_a_few_runs_named_fails_the_next_run():
    table = {}

    def replay(dp, tp, pp, gpus_per_node, order):
        return dict(table.get((dp, tp, pp, gpus_per_node, order), {"tp": True, "dp": False, "pp": False}))

    for seed in (11, 12, 13):   # fix each named job until the run passes, as a learner reading messages would
        for _ in range(40):
            result = run_check("groups_inside_node", replay, seed=seed)
            if result.passed:
                break
            found = re.search(r"groups_inside_node\((\d+), (\d+), (\d+), (\d+), '([a-z-]+)'\).*?: (tp|dp|pp) groups "
                              r"expected (inside|crossing)", result.message)
            job = (*map(int, found.groups()[:4]), found[5])
            table.setdefault(job, {"tp": True, "dp": False, "pp": False})[found[6]] = found[7] == "inside"
        assert result.passed
    assert not run_check("groups_inside_node", replay, seed=14).passed


# --- build_groups on 8 ranks: one launch each -------------------------------------------------------------------

def test_build_groups_with_new_group_and_with_init_device_mesh_pass():
    for source, seed in ((BUILD, 1), (MESH, 2)):
        result = run_check("build_groups", source, timeout=120, seed=seed)
        assert result.passed, result.message


def test_build_groups_with_sizes_swapped_names_the_group_it_summed():
    swapped = variant(BUILD, 'size = {"tp": tp, "dp": dp, "pp": pp}', 'size = {"tp": dp, "dp": tp, "pp": pp}')
    message = run_check("build_groups", swapped, timeout=120, seed=5).message
    found = re.search(r"dp=(\d), tp=(\d), pp=(\d), order '([a-z-]+)': your (tp|dp|pp) group on rank (\d) summed ranks "
                      r"\{([0-9, ]+)\} \(bits 0b[01]+\); expected \{([0-9, ]+)\}", message)
    assert found, message
    dp, tp, pp, order, dim, rank = *map(int, found.groups()[:3]), found[4], found[5], int(found[6])
    assert [int(r) for r in found[8].split(", ")] == next(g for g in expected_groups(dim, dp, tp, pp, order)
                                                          if rank in g)
    assert re.search(r"is rank \d's (tp|dp|pp) group: are (tp|dp|pp) and (tp|dp|pp) swapped \(their sizes", message) \
        or "group in the order '" in message, message


def observed(seed: int, groups_of) -> str:
    """The observations 8 ranks would publish for an answer whose rank-r group along dim is groups_of(...)."""
    ranks = []
    for rank in range(8):
        runs = []
        for dp, tp, pp, order in grids(seed):
            seen = {dim: {"ranks": groups_of(dp, tp, pp, order, rank, dim)} for dim in DIMS}
            for record in seen.values():
                record["sum"] = sum(1 << r for r in record["ranks"])
            runs.append({"returned": "dict", "keys": sorted(DIMS), "groups": seen})
        ranks.append(runs)
    return json.dumps(ranks)


def megatron(dp, tp, pp, order, rank, dim):
    return next(g for g in expected_groups(dim, dp, tp, pp, "tp-dp-pp") if rank in g)


def test_a_table_of_the_groups_a_few_runs_named_fails_the_next_run_on_the_ranks():
    # The messages of an answer that always uses Megatron-Core's order, read for three runs until each passes
    # (the verify half on the observations that answer's ranks publish: no launch), make a table; the answer
    # that looks the table up, and falls back to Megatron-Core's order, runs on 8 ranks for the next seed.
    spec, table = spec_of("build_groups", 1), {}

    def from_table(dp, tp, pp, order, rank, dim):
        return table.get((dp, tp, pp, order, rank, dim)) or megatron(dp, tp, pp, order, rank, dim)

    for seed in (21, 22, 23):
        for _ in range(80):
            problems = verify(spec, observed(seed, from_table), seed)
            if not problems:
                break
            found = re.search(r"dp=(\d), tp=(\d), pp=(\d), order '([a-z-]+)': your (tp|dp|pp) group on rank (\d) "
                              r"summed .*?expected \{([0-9, ]+)\}", problems[0])
            key = (*map(int, found.groups()[:3]), found[4], int(found[6]), found[5])   # grid, rank, dim
            table[key] = [int(r) for r in found[7].split(", ")]
        assert not problems
    replay = Source("build_groups", f'''def build_groups(dp, tp, pp, order):
    table = {table!r}
    me, n, mine = dist.get_rank(), dp * tp * pp, {{}}
    for dim in ("tp", "dp", "pp"):
        stride = {{"tp": 1, "dp": tp, "pp": tp * dp}}[dim]
        size = {{"tp": tp, "dp": dp, "pp": pp}}[dim]
        megatron = [[r - r // stride % size * stride + k * stride for k in range(size)] for r in range(n)]
        groups = sorted({{tuple(table.get((dp, tp, pp, order, r, dim), megatron[r])) for r in range(n)}})
        for ranks in groups:
            group = dist.new_group(list(ranks))
            if me in ranks and dim not in mine:
                mine[dim] = group
    return mine
''')
    message = run_check("build_groups", replay, timeout=60, seed=24).message
    assert "✗ build_groups failed" in message and "group in the order 'tp-dp-pp'" in message, message


def test_build_groups_only_by_their_members_ends_in_the_deadlock_hint():
    # Only the members call new_group: the ranks number their groups differently and wait on each other in
    # Gloo's rendezvous until the launcher's limit; kept short, as the hang is the whole test.
    members_only = variant(BUILD, "            group = dist.new_group(ranks)  # collective: every rank, every group, "
                           "same order\n            if me in ranks:\n",
                           "            if me in ranks:\n                group = dist.new_group(ranks)\n")
    message = run_check("build_groups", members_only, timeout=20, seed=1).message
    assert "timed out" in message or "the ranks did not build the same groups" in message, message
    assert "dist.new_group is collective: every rank must call it for every group" in message, message
