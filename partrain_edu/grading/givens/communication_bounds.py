"""What exercise 13 hands out: the hardware and the model to put into your formulas, as plain numbers.

The devices are `theory.hardware`'s (vendor datasheets, SXM parts; their links are `theory.traffic.LINKS`' for
the H100 and one generation older for the A100); the model is Megatron's 7.5B GPT, 36 layers × 4096
(Narayanan et al. 2021, Table 1), counted by `theory.memory.gpt_param_count`. None of them is an answer.
"""
from __future__ import annotations

from partrain_edu.theory.hardware import DEVICES
from partrain_edu.theory.memory import gpt_param_count
from partrain_edu.theory.network import DATASHEET, group_link

# dense bf16 FLOP/s per device
PEAK_FLOPS = {name: device.peak_flops for name, device in DEVICES.items()}
# bytes/s each way per device: NVLink to the GPUs of its node; across nodes, what a group's ring gives each member
# (`theory.network.group_link`, at the datasheet): "infiniband" its own NIC, for a group with one member per node
# (a tp = 8 layout's dp group); "8 NICs" the node's 8 NICs shared by its 8 members, capped by NVLink (NCCL runs
# one ring per NIC), for a group that holds whole nodes
BANDWIDTH = {name: {"nvlink": device.nvlink, "infiniband": device.nic,
                    "8 NICs": group_link(device, 16, 8, efficiency=DATASHEET).beta} for name, device in DEVICES.items()}
MODEL_7_5B = {"params": gpt_param_count(36, 4096, vocab=51200, seq=2048), "layers": 36, "hidden": 4096, "seq": 2048}
