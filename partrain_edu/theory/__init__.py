"""What the formulas say: pure Python, no torch, instant (so widgets redraw as a slider moves).

- ``memory``     bytes per device for parameters, gradients, optimizer states, activations
                 (ZeRO, Rajbhandari et al. 2020; Megatron-LM, Narayanan et al. 2021; Korthikanti et al. 2022)
- ``traffic``    bytes each rank sends per training step, per collective (ring cost model)
- ``schedules``  pipeline schedules as per-stage action lists, and a simulator (GPipe, 1F1B, interleaved, ZB-H1)
- ``planner``    which strategy for this model on these GPUs (the source notes' decision order, then a search)
- ``batch_limit`` how many data-parallel replicas a global batch can feed, and when 2D (FSDP × TP) is needed
- ``efficiency`` FLOPs per token, MFU/HFU, arithmetic intensity and the roofline, comm/compute per dimension
- ``moe``        mixture-of-experts capacity, dropped tokens, the load-balancing loss, all-to-all bytes

Each is also a ``partrain-edu`` subcommand (``theory/cli.py``); bad input raises ValueError with one line
that names the fix.
"""

from partrain_edu.theory.memory import MemoryEstimate, estimate_memory, gpt_param_count
from partrain_edu.theory.planner import Plan, plan
from partrain_edu.theory.schedules import Action, Schedule, SimResult, build_schedule, simulate
from partrain_edu.theory.traffic import LINKS, StepTraffic, link_time, ring_bytes_sent, step_traffic

__all__ = [
    "MemoryEstimate", "estimate_memory", "gpt_param_count",
    "Plan", "plan",
    "Action", "Schedule", "SimResult", "build_schedule", "simulate",
    "LINKS", "StepTraffic", "link_time", "ring_bytes_sent", "step_traffic",
]
