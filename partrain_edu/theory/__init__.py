"""What the formulas say: pure Python, no torch, instant (so widgets redraw as a slider moves).

- ``memory``     bytes per device: parameters, gradients, optimizer states, activations (ZeRO; Korthikanti 2022)
- ``traffic``    bytes each rank sends per training step, per collective (ring cost model)
- ``network``    what a collective costs on the links its group crosses (NVLink, the node's NICs)
- ``schedules``  pipeline schedules as per-stage action lists, and a simulator (GPipe, 1F1B, interleaved, ZB-H1)
- ``model_spec`` a transformer's shape (GQA, SwiGLU, MoE, untied): parameters, FLOPs per token; presets
- ``hardware``   GPU presets with sources; ``calibration`` what each achieves, fitted on ``published_runs``
- ``layout``     how a step is spread (tp, pp, vpp, dp, cp, ep, ZeRO, batch, recompute); ``layout_memory`` its
                 fullest GPU's bytes; ``step_time`` its seconds; ``estimate`` both, with MFU (``estimate``)
- ``planner``    which layout for this model on these GPUs: every layout that fits, priced by ``estimate``
- ``batch_limit`` how many data-parallel replicas a global batch can feed, and when 2D (FSDP × TP) is needed
- ``efficiency`` FLOPs per token, MFU/HFU, arithmetic intensity and the roofline, comm/compute per dimension
- ``moe``        mixture-of-experts capacity, dropped tokens, the load-balancing loss, all-to-all bytes

Each is also a ``partrain-edu`` subcommand (``theory/cli.py``); bad input raises a one-line ValueError.
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
