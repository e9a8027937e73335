"""3D parallelism: the groups of the one rank grid (`theory.grid`) by hand and by `init_device_mesh`, `3d`
against `single`, and each dimension's traffic against the ring cost model.

One 8-rank launch (2 × 2 × 2) and one 4-rank launch (two layouts in one world) run every check and publish
the numbers; the tests assert.
"""
import subprocess
import sys

import pytest

from partrain_edu.config import TrainConfig
from partrain_edu.launcher import torchrun
from partrain_edu.strategies import get_strategy
from partrain_edu.theory import grid
from partrain_edu.theory.traffic import ring_bytes_sent
from partrain_edu.train import launch

STEPS, M, GLOBAL_BATCH = 4, 2, 16
FP32 = 4

RANK_SCRIPT = r'''
import sys
from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens
from partrain_edu.parallel.hybrid import traffic_by_dimension
from partrain_edu.config import TrainConfig
from partrain_edu.strategies import get_strategy, tensor_bytes
from partrain_edu.train import run
import torch.distributed as dist

steps, m = int(sys.argv[1]), int(sys.argv[2])
layouts = [tuple(int(v) for v in item.split("x")) for item in sys.argv[3].split(",")]  # (dp, tp, pp)
strategies = sys.argv[4].split(",")
ctx = runtime.init()
out = {"losses": {}, "grids": {}}
for (dp, tp, pp), name in zip(layouts, strategies):
    key = f"{name}:{dp}x{tp}x{pp}"
    hand, mesh = ctx.with_layout(dp, tp, pp).topology, ctx.with_layout(dp, tp, pp, use_mesh=True).topology
    out["grids"][key] = {"hand": hand.ranks, "mesh": mesh.ranks, "coords": hand.coords, "sizes": hand.sizes}
    cfg = TrainConfig(strategy=name, nproc=ctx.world_size, steps=steps, microbatches=m, dp=dp, tp=tp, pp=pp)
    out["losses"][key] = run(ctx, cfg)["losses"]
# one more step of the last layout under a tracer: what each rank sends along each dimension
strategy = get_strategy(strategies[-1])(ctx, cfg)
x, y = SyntheticTokens(cfg.model.vocab_size, cfg.model.seq_len, seed=0).global_batch(0, cfg.global_batch)
with CommTracer() as tracer:
    strategy.train_step(x, y)
mine = {"coords": strategy.ctx.coords, "layers": list(strategy.stage.layers),
        "param_bytes": tensor_bytes(strategy.model.parameters()),
        "traffic": traffic_by_dimension(tracer.records, strategy.ctx.topology), "grids": out["grids"]}
everyone = [None] * ctx.world_size
dist.all_gather_object(everyone, mine)
out["ranks"] = everyone
runtime.publish("hybrid", out)
runtime.shutdown()
'''


def _launch(nproc, layouts, strategies):
    args = (str(STEPS), str(M), ",".join("x".join(map(str, layout)) for layout in layouts), ",".join(strategies))
    return torchrun(RANK_SCRIPT, nproc=nproc, args=args, timeout=300).published["hybrid"]


@pytest.fixture(scope="module")
def single():
    return launch(TrainConfig(strategy="single", steps=STEPS, microbatches=M))["losses"]


@pytest.fixture(scope="module")
def eight():
    return _launch(8, [(2, 2, 2)], ["3d"])


@pytest.fixture(scope="module")
def four():
    return _launch(4, [(2, 2, 1), (1, 2, 2), (2, 1, 2)], ["3d-mesh", "3d", "3d"])


def _close(losses, reference):
    return max(abs(a - b) / b for a, b in zip(losses, reference, strict=True)) < 1e-5


@pytest.mark.parametrize("sizes", [dict(dp=3, tp=2, pp=2), dict(dp=1, tp=2, pp=2)])
def test_layout_that_does_not_fill_the_world_names_the_fix(sizes):
    with pytest.raises(ValueError, match=r"product is --nproc 8"):
        get_strategy("3d").layout(TrainConfig(strategy="3d", nproc=8, **sizes))


def test_cli_exits_2_on_a_bad_layout():
    cmd = [sys.executable, "-m", "partrain_edu", "train", "--strategy", "3d", "--nproc", "8",
           "--dp", "3", "--tp", "2", "--pp", "2", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--dp 3 × --tp 2 × --pp 2 = 12" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_other_bad_sizes_name_the_fix():
    with pytest.raises(ValueError, match="--tp 3 does not divide"):
        get_strategy("3d").layout(TrainConfig(strategy="3d", nproc=6, dp=1, tp=3, pp=2))
    with pytest.raises(ValueError, match="divisible by dp × microbatches"):
        get_strategy("3d").layout(TrainConfig(strategy="3d", nproc=8, dp=2, tp=2, pp=2, microbatches=16))


def test_2x2x2_reproduces_single(eight, single):
    losses = eight["losses"]["3d:2x2x2"]
    assert len(losses) == STEPS and _close(losses, single), (losses, single)


def test_every_rank_gets_the_grid_groups_by_hand_and_from_a_device_mesh(eight, four):
    for result in (eight, four):
        for rank, r in enumerate(result["ranks"]):
            for built in r["grids"].values():
                assert built["coords"] == grid.coordinates(rank, built["sizes"])
                assert built["hand"] == built["mesh"]
                assert all(rank in built["hand"][d] and built["hand"][d] in grid.group_ranks(d, built["sizes"])
                           for d in grid.ORDER)


@pytest.mark.parametrize("key", ["3d-mesh:2x2x1", "3d:1x2x2", "3d:2x1x2"])
def test_two_dimensional_layouts_reproduce_single(four, single, key):
    assert _close(four["losses"][key], single), (key, four["losses"][key], single)


def test_each_dimension_sends_what_the_ring_model_says(eight):
    dp = tp = pp = 2
    b, T, H = GLOBAL_BATCH // (dp * M), 32, 64
    activation = b * T * H * FP32                      # (B/dp/m, T, H) fp32: every TP all-reduce, every PP message
    for r in eight["ranks"]:
        lo, hi = r["layers"]
        first, last = r["coords"]["pp"] == 0, r["coords"]["pp"] == pp - 1
        # per micro-batch: 4 all-reduces per layer (Megatron), the embedding's g, the head's f, 3 loss all-reduces
        tp_payloads = M * (4 * (hi - lo) * [activation] + first * [activation]
                           + last * [activation, b * T * FP32, b * T * FP32, b * T * FP32])
        traffic = r["traffic"]
        assert traffic["tp"]["bytes"] == sum(ring_bytes_sent("all_reduce", s, tp) for s in tp_payloads)
        assert traffic["tp"]["calls"] == len(tp_payloads)
        assert traffic["pp"]["bytes"] == M * activation    # activations forward (stage 0) or gradients back
        assert traffic["dp"] == {"calls": 1, "bytes": ring_bytes_sent("all_reduce", r["param_bytes"], dp)}
        assert traffic["world"]["bytes"] == 0
