"""Rank side of tests/test_emulated.py: 4 ranks on the emulated A100, timed by its clock.

Runs generic modules the library has never seen (stacks of Linear layers), each charged a fixed emulated cost:
the pipeline executor's GPipe, 1F1B and interleaved 1F1B at p = 4, m = 8 (and 1F1B with a 1.5× slower last
stage), the course's DDP with one bucket per layer and with one bucket for everything, and that single-bucket
DDP across emulated nodes joined by 1 GbE and by InfiniBand. Rank 0 publishes the measured numbers beside
what the formulas and the simulator predict; the test compares them.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from partrain_edu import runtime
from partrain_edu.parallel.ddp import DistributedDataParallel
from partrain_edu.parallel.pipeline import PipelineExecutor, Stage, gather_timeline, measured_bubble
from partrain_edu.parallel.pp_comm import Boundary, Mailbox
from partrain_edu.theory.schedules import build_schedule, simulate
from partrain_edu.theory.traffic import bucketed_backward_end, collective_time

ctx = runtime.init(device="emulated:a100,scale=0.25")
em, p, m, H = ctx.emulator, ctx.world_size, 8, 16
T_STAGE = 0.02                                   # emulated seconds of one stage's forward of one micro-batch
results = {}


def pipeline(name: str, v: int) -> tuple[float, float]:
    """(measured bubble, makespan) of one step, in emulated seconds, after a warm-up step."""
    torch.manual_seed(0)
    layers = nn.Sequential(*[nn.Sequential(nn.Linear(H, H), nn.Tanh()) for _ in range(p * v)])
    chunks = [Stage(layers, c * p + ctx.rank, c * p + ctx.rank + 1) for c in range(v)]
    handles = [em.charge(chunk, T_STAGE / v) for chunk in chunks]
    mail = Mailbox([Boundary((2, H))] * (p * v - 1), m)
    executor = PipelineExecutor(build_schedule(name, p, m, v), chunks, ctx.rank, list(range(p)), mail,
                                F.mse_loss, clock=em.now)
    x, y = torch.randn(2 * m, H), torch.randn(2 * m, H)
    for _ in range(2):
        dist.barrier()
        executor.step(x, y)
    for h in handles:
        h.remove()
    events = gather_timeline(executor.events)
    makespan = max(e["end"] for e in events) / em.scale
    return measured_bubble(events, p), makespan


for name, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
    bubble, makespan = pipeline(name, v)
    results[name] = {"bubble": bubble, "makespan": makespan,
                     "simulated": simulate(build_schedule(name, p, m, v)).bubble_fraction}
em.slow[p - 1] = 1.5                             # a straggler: the last stage's device is 1.5× slower
results["slow_last"] = {"makespan": pipeline("1f1b", 1)[1]}
em.slow.clear()
schedule = build_schedule("1f1b", p, m)
results["slow_last"]["simulated_ratio"] = (simulate(schedule, stage_costs=[1, 1, 1, 1.5]).makespan
                                           / simulate(schedule).makespan)

# DDP: K equal layers, backward 2·T per layer, one all-reduce of each layer's gradients of cost c.
K, T_LAYER, BYTES_SCALE = 4, 0.01, 4e6     # BYTES_SCALE: all-reduce time ≈ backward time


def ddp_step(bucket_cap: int) -> tuple[float, int, dict]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(H, H) for _ in range(K)])
    handles = [em.charge(layer, T_LAYER) for layer in model]
    ddp = DistributedDataParallel(model, bucket_cap_bytes=bucket_cap, clock=em.now)   # its timeline on the clock
    x = torch.randn(4, H)
    for _ in range(2):
        dist.barrier()
        start = em.now()
        ddp(x).square().mean().backward()        # DDP waits for its buckets at the end of backward
        took = (em.now() - start) / em.scale
    for h in handles:
        h.remove()
    return took, len(ddp.buckets), ddp.timeline[-1]


layer_bytes = (H * H + H) * 4
em.bytes_scale = BYTES_SCALE
_, alpha, beta = em.link_of(tuple(range(p)))
per_layer = collective_time("all_reduce", int(layer_bytes * BYTES_SCALE), p, alpha=alpha, beta=beta)
everything = collective_time("all_reduce", int(K * layer_bytes * BYTES_SCALE), p, alpha=alpha, beta=beta)
(bucketed, k, timeline), (single, one, _) = ddp_step(layer_bytes), ddp_step(K * layer_bytes)
forward, backward = K * T_LAYER, 2 * K * T_LAYER
results["ddp"] = {"buckets": [k, one], "bucketed": bucketed, "single": single, "per_layer": per_layer,
                  "timeline": {"compute_end": timeline["compute_end"] / em.scale,
                               "finished": [b["finished"] / em.scale for b in timeline["buckets"]]},
                  "model_bucketed": forward + bucketed_backward_end(backward, [per_layer] * K),
                  "model_single": forward + bucketed_backward_end(backward, [everything])}

# One rank per emulated node: every all-reduce crosses the network.
em.node, em.bytes_scale, times = 1, BYTES_SCALE / 100, {}
for net in ("1gbe", "infiniband"):
    em.net = net
    times[net] = ddp_step(K * layer_bytes)[0]
    _, alpha, beta = em.link_of(tuple(range(p)))
    times[f"model_{net}"] = forward + backward + collective_time(
        "all_reduce", int(K * layer_bytes * em.bytes_scale), p, alpha=alpha, beta=beta)
results["links"] = times
results["report"] = em.report()
runtime.publish("results", results)
runtime.shutdown()
