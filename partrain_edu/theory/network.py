"""What one collective costs on the links its group crosses: NVLink inside a node, the node's NICs across nodes.

    link = group_link(device_named("h100-sxm"), members=64, per_node=8)    # FSDP over 8 nodes × 8 GPUs
    group_seconds("all_gather", 2 * 13e9, members=64, per_node=8, device=device_named("h100-sxm"))

A group of n ranks with **k members on each node** it touches (`members_per_node`):

- **one node** (k = n): a ring on NVLink, each GPU's own link to the switch: β = NVLink · η_NVLink.
- **several nodes**: NCCL runs one channel (ring or tree) per NIC, and 7/8 of each ring stays on NVLink, so the k
  members of a node cross the network on k NICs at once: **β = min(NVLink · η_NVLink, k · NIC · η_net)**, the
  node's egress that this group owns. NVIDIA measures 192 GB/s all-reduce bus bandwidth between DGX A100 nodes with
  8 × 200 Gb/s NICs (NVIDIA/nccl #1576, quoting #812): 8 × 25 GB/s × 0.96. "Beyond the node level, the cost of an
  AllGather or ReduceScatter on B bytes is roughly B / W_node egress" (Austin et al. 2025, "How to Scale Your
  Model", GPU chapter: max[B/W_GPU, B/W_node]). A tp = 8 layout's data-parallel group has k = 1: one NIC for 1/8
  of the bytes, the same seconds per GPU as k = 8 for all of them.
- **α** per ring step (Hockney 1994): the network's when the ring leaves the node, NVLink's inside it
  (`traffic.LATENCY`: orders of magnitude). Ring steps, 2(n−1) for an all-reduce: NCCL's trees cut the count to
  O(log n) across nodes, so at thousands of ranks this over-charges small messages (stated, not modelled).

η are the fractions of a link's datasheet bandwidth that NCCL's bus bandwidth reaches, **measured, not fitted**:
NVLink ≈ 0.82 (NVIDIA/nccl-tests #212: ≈ 370 of 450 GB/s on an H100 node); InfiniBand NDR ≈ 0.96 (nccl-tests
#267: 48–49 of 50 GB/s per NIC); the same for any network. Each GPU owns one NIC (DGX, rails); a cluster with
fewer NICs gives its per-GPU share (`network_gbps`: BLOOM's 4 × 100 Gb/s over 8 GPUs is 50 Gb/s each).
Everything that prices a collective — `traffic`, `batch_limit`, `step_time`, the planner, the emulated device,
the widgets — asks this module. Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.theory.traffic import LATENCY, LINKS, collective_time

EFFICIENCY = {"nvlink": 0.82, "network": 0.96}     # NCCL bus bandwidth / datasheet (sources above)
DATASHEET = {"nvlink": 1.0, "network": 1.0}        # the links at their datasheet rates: an upper bound


@dataclass(frozen=True)
class Link:
    """What a ring of this group runs at: α seconds per step, β bytes/s each member sends, and which fabric."""
    alpha: float
    beta: float
    fabric: str          # "nvlink" (one node), or the network's name ("infiniband", "10gbe", …)


def members_per_node(members: int, stride: int, gpus_per_node: int) -> int:
    """How many of a group's `members`, `stride` ranks apart (tp innermost: a dp group's stride is tp·cp), share
    one node of `gpus_per_node` consecutive ranks: min(n, node / stride), at least 1."""
    for name, value in (("members", members), ("stride", stride), ("gpus_per_node", gpus_per_node)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return max(1, min(members, gpus_per_node // stride))


def group_link(device, members: int, per_node: int, network: str = "infiniband", nic: float | None = None,
               efficiency: dict[str, float] = EFFICIENCY) -> Link:
    """α, β of a ring over `members` ranks with `per_node` of them on each node, GPUs of `device` (a
    `hardware.Device`); `nic` replaces the device's NIC bandwidth per GPU (bytes/s), `network` names the fabric
    between nodes (`traffic.LINKS`; its datasheet rate replaces the NIC's unless `nic` is given); `efficiency`
    the share of each link's rate the ring reaches (NCCL's measured, or `DATASHEET`)."""
    if network not in LINKS or network == "nvlink":
        raise ValueError(f"network must be one of {', '.join(k for k in LINKS if k != 'nvlink')}, got {network!r}")
    if not 1 <= per_node <= members:
        raise ValueError(f"per_node must be between 1 and members ({members}), got {per_node}")
    nvlink = device.nvlink * efficiency["nvlink"]
    if per_node == members:
        return Link(LATENCY["nvlink"], nvlink, "nvlink")
    per_gpu = nic if nic else (device.nic if network == "infiniband" else LINKS[network])
    egress = per_node * per_gpu * efficiency["network"]
    return Link(LATENCY[network], min(nvlink, egress) if per_node > 1 else egress, network)


def group_seconds(op: str, nbytes: float, members: int, per_node: int, device, network: str = "infiniband",
                  nic: float | None = None, efficiency: dict[str, float] = EFFICIENCY) -> float:
    """Seconds of one `op` on a full tensor of `nbytes` over the group: ring steps · α + ring bytes / β
    (`traffic.collective_time`) on `group_link`'s link; 0 for one member or no bytes."""
    if members < 2 or not nbytes:
        return 0.0
    link = group_link(device, members, per_node, network, nic, efficiency)
    return collective_time(op, int(nbytes), members, alpha=link.alpha, beta=link.beta)


def all_to_all_seconds(nbytes: float, members: int, per_node: int, device, network: str = "infiniband",
                       nic: float | None = None, efficiency: dict[str, float] = EFFICIENCY) -> float:
    """Seconds of one all-to-all in which each member sends (n−1)/n of its `nbytes`: the (k−1)/n bound for its
    own node over NVLink, the (n−k)/n bound elsewhere through its own NIC (a node's k members own k NICs, and each
    NIC carries one member's share), both at once: (n−1)·α + max(inside / β_NVLink, outside / β_NIC)."""
    if members < 2 or not nbytes:
        return 0.0
    inside = group_link(device, per_node, per_node, efficiency=efficiency) if per_node > 1 else None
    outside = group_link(device, members, 1, network, nic, efficiency) if per_node < members else None
    link = outside or inside
    seconds = max((per_node - 1) / members * nbytes / inside.beta if inside else 0.0,
                  (members - per_node) / members * nbytes / outside.beta if outside else 0.0)
    return (members - 1) * link.alpha + seconds
