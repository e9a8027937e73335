"""3D parallelism (3D 并行): data × pipeline × tensor parallelism from one world, the way Megatron-LM trains.

    partrain-edu train --strategy 3d --nproc 8 --dp 2 --tp 2 --pp 2 --microbatches 2 --json

**Layout** (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §3). The world of dp·pp·tp ranks is a 3-d grid; rank r has coordinates (d, s, t), tensor
parallelism innermost:

    r = (d · pp + s) · tp + t

so the tp ranks of one tensor-parallel group are neighbours — on a real cluster, GPUs of one node joined by
NVLink, where TP's per-layer all-reduces belong. Pipeline stages sit further apart (across nodes: only
point-to-point activations cross), and data parallelism is outermost (one gradient all-reduce per step, which
overlaps with compute). `build_groups` makes the groups by hand from that formula; `build_groups(...,
use_mesh=True)` asks `torch.distributed.device_mesh.init_device_mesh` for a ("dp", "pp", "tp") mesh — the
same groups, named.

**Sharded**: rank (d, s, t) holds pipeline stage s's layers (pipeline.py), of each layer the t-th tensor
slice (tensor.py), and trains on the d-th slice of the global batch. Parameters per rank ≈ Ψ / (pp · tp).

**Communicated**, per step, by the rank (tp, pp and dp each use only their own group):
- tp group: 4 all-reduces of (B/dp/m)·T·H per layer held and micro-batch, plus the embedding's and loss's;
- pp group: each micro-batch's (B/dp/m, T, H) activation forward and its gradient back, per stage boundary;
- dp group: one all-reduce of this rank's gradients, Ψ/(pp·tp) elements, after the pipeline has drained
  (the buckets of buckets.py, averaged over dp as in DDP).

**Equivalence**: the pipeline sums (loss_mb / m)' over micro-batches, TP's f/g make every slice's gradient
the full model's slice, and the dp average of the replicas' gradients is the gradient of the global batch,
so the losses equal `single`'s.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from partrain_edu.data import data_parallel_slice
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.buckets import plan_buckets
from partrain_edu.parallel.ddp import DEFAULT_BUCKET_CAP_BYTES
from partrain_edu.parallel.pipeline import PipelineExecutor, StageModule, split_layers
from partrain_edu.parallel.pp_comm import Mailbox, agree_on_shapes
from partrain_edu.parallel.tensor import (TensorParallelRegion, check_divisible, parallelize,
                                          vocab_parallel_cross_entropy)
from partrain_edu.theory.schedules import build_schedule
from partrain_edu.train import Strategy, TrainConfig, register

DIMS = ("dp", "pp", "tp")  # outermost first: tp innermost, as in Megatron-LM


def coordinates(rank: int, dp: int, pp: int, tp: int) -> dict[str, int]:
    """Global rank → {"dp": d, "pp": s, "tp": t} with r = (d·pp + s)·tp + t."""
    if not 0 <= rank < dp * pp * tp:
        raise ValueError(f"rank {rank} is outside a world of dp·pp·tp = {dp * pp * tp} ranks")
    return {"dp": rank // (pp * tp), "pp": rank // tp % pp, "tp": rank % tp}


def rank_of(d: int, s: int, t: int, pp: int, tp: int) -> int:
    return (d * pp + s) * tp + t


def group_ranks(dim: str, dp: int, pp: int, tp: int) -> list[list[int]]:
    """Every group along `dim`: the ranks whose other two coordinates are equal, in order of `dim`'s."""
    groups: dict[tuple[int, int], list[int]] = {}
    for r in range(dp * pp * tp):
        c = coordinates(r, dp, pp, tp)
        groups.setdefault(tuple(c[d] for d in DIMS if d != dim), []).append(r)  # r grows with c[dim]
    return [groups[key] for key in sorted(groups)]


def check_layout(dp: int, tp: int, pp: int, world_size: int) -> None:
    if dp * tp * pp != world_size:
        raise ValueError(f"--dp {dp} × --tp {tp} × --pp {pp} = {dp * tp * pp} ranks, but there are "
                         f"{world_size}: pick sizes whose product is --nproc {world_size}")


@dataclass(frozen=True)
class HybridGroups:
    """This rank's place in the grid: its coordinates, and for each dimension its group and the group's
    global ranks (in group-rank order)."""
    coords: dict[str, int]
    sizes: dict[str, int]
    groups: dict[str, object]
    ranks: dict[str, list[int]]
    mesh: object = None  # the DeviceMesh when built with use_mesh=True


def build_groups(dp: int, tp: int, pp: int, use_mesh: bool = False, device_type: str = "cpu") -> HybridGroups:
    """The dp, pp and tp process groups of this rank. Every rank must call this (new_group is collective)."""
    world, me = dist.get_world_size(), dist.get_rank()
    check_layout(dp, tp, pp, world)
    sizes = {"dp": dp, "pp": pp, "tp": tp}
    if use_mesh:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(device_type, (dp, pp, tp), mesh_dim_names=DIMS)  # row-major: same formula
        groups = {d: mesh[d].get_group() for d in DIMS}
        ranks = {d: dist.get_process_group_ranks(groups[d]) for d in DIMS}
        return HybridGroups(coordinates(me, dp, pp, tp), sizes, groups, ranks, mesh)
    groups, ranks = {}, {}
    for dim in DIMS:
        for members in group_ranks(dim, dp, pp, tp):
            group = dist.new_group(members)  # every rank creates every group, in the same order
            if me in members:
                groups[dim], ranks[dim] = group, members
    return HybridGroups(coordinates(me, dp, pp, tp), sizes, groups, ranks)


def dimension_of(record, grid: HybridGroups) -> str:
    """Which grid dimension a `CommRecord` travelled along: a collective by its group's ranks, a p2p
    message (sent on the world group) by its peer."""
    for dim in DIMS:
        if tuple(record.group_ranks) == tuple(grid.ranks[dim]):
            return dim
    if record.peer is not None and record.peer in grid.ranks["pp"]:
        return "pp"
    return "world"


def traffic_by_dimension(records, grid: HybridGroups) -> dict[str, dict[str, int]]:
    """{dim: {"calls", "bytes"}} this rank sent along each dimension (ring cost model, `CommRecord.sent`)."""
    out = {dim: {"calls": 0, "bytes": 0} for dim in (*DIMS, "world")}
    for r in records:
        entry = out[dimension_of(r, grid)]
        entry["calls"] += 1
        entry["bytes"] += r.sent
    return out


def dp_average_gradients(buckets, group, size: int) -> None:
    """After the pipeline has drained: average each bucket of gradients over the data-parallel group
    (DDP's bucketed all-reduce, without the overlap: the last micro-batch's backward is already done)."""
    for bucket in buckets:
        flat = bucket.pack()     # (bucket numel,) this replica's gradients
        flat.div_(size)
        dist.all_reduce(flat, group=group)
        bucket.unpack()


@register("3d")
class ThreeD(Strategy):
    """Stages of TP-split layers, replicated dp times; the 1F1B schedule inside each pipeline."""

    schedule_name = "1f1b"
    use_mesh = False

    @classmethod
    def layout(cls, cfg: TrainConfig) -> tuple[int, int, int]:
        tp, pp = cfg.tp or 1, cfg.pp or 1
        dp = cfg.dp or cfg.nproc // (tp * pp) or 1
        check_layout(dp, tp, pp, cfg.nproc)
        check_divisible(cfg.model, tp)
        if pp > cfg.model.n_layer:
            raise ValueError(f"--pp {pp} is more stages than the model's {cfg.model.n_layer} layers: use --pp "
                             f"{cfg.model.n_layer} or less")
        if cfg.global_batch % (dp * cfg.microbatches):
            raise ValueError(f"--global-batch {cfg.global_batch} must be divisible by dp × microbatches = "
                             f"{dp} × {cfg.microbatches}")
        return dp, tp, pp

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.grid = build_groups(self.dp, self.tp, self.pp, use_mesh=self.use_mesh,
                                 device_type=torch.device(ctx.device).type)
        d, s = self.grid.coords["dp"], self.grid.coords["pp"]
        self.region = TensorParallelRegion(self.grid.groups["tp"])
        full = self.new_model()                                 # the same init on every rank
        if self.tp > 1:                                         # keep every layer's t-th slice
            full = parallelize(full, self.region)
        loss_fn = (lambda logits, y: vocab_parallel_cross_entropy(logits, y, self.region)) if self.tp > 1 \
            else TinyGPT.loss
        lo, hi = split_layers(full, self.pp)[s]
        self.stage = StageModule(full, lo, hi, first=s == 0, last=s == self.pp - 1).to(ctx.device)
        self.model = self.stage
        self.optimizer = self.new_optimizer(self.model.parameters())
        m = cfg.microbatches
        shape = (cfg.global_batch // (self.dp * m), cfg.model.seq_len, cfg.model.n_embd)  # (B/dp/m, T, H)
        agree_on_shapes({"shape": shape, "layers": [(lo, hi)]}, group=self.grid.groups["pp"])
        self.executor = PipelineExecutor(
            build_schedule(self.schedule_name, self.pp, m, 1), [self.stage], s, self.grid.ranks["pp"],
            Mailbox(shape, m, self.pp, device=ctx.device),      # global ranks: the world group carries p2p
            loss_fn=loss_fn)
        self.buckets = plan_buckets([p for p in self.model.parameters() if p.requires_grad],
                                    DEFAULT_BUCKET_CAP_BYTES)
        self.dp_rank = d

    def train_step(self, x, y):
        x, y = data_parallel_slice(x, y, self.dp_rank, self.dp)   # (B/dp, T) this replica's batch
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum, count = self.executor.step(x.to(self.ctx.device), y.to(self.ctx.device))
        self.region.finish_grads(self.model)
        if self.dp > 1:
            dp_average_gradients(self.buckets, self.grid.groups["dp"], self.dp)
        self.optimizer.step()
        # Every tp rank of the last stage holds the same loss: only t = 0 reports it, once per replica.
        return (loss_sum, count) if self.grid.coords["tp"] == 0 else (0.0, 0)


@register("3d-mesh")
class ThreeDMesh(ThreeD):
    """The same, its groups from `init_device_mesh(("dp", "pp", "tp"))` instead of by hand."""
    use_mesh = True
