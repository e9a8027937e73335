"""Collectives priced on the nodes they cross (`theory.network`): one rule for the model, the planner and the
emulated device, checked against NVIDIA's measured bus bandwidths and the Scaling Book's node-egress rule."""
import pytest

from partrain_edu import emulated
from partrain_edu.theory.estimate import estimate
from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.layout import Layout
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.network import EFFICIENCY, all_to_all_seconds, group_link, group_seconds, members_per_node

A100, H100 = device_named("a100-80gb"), device_named("h100-sxm")


def test_a_group_on_one_node_runs_on_nvlink():
    link = group_link(H100, members=8, per_node=8)
    assert link.fabric == "nvlink" and link.beta == pytest.approx(450e9 * EFFICIENCY["nvlink"])


def test_eight_members_per_node_cross_on_eight_nics():
    one, eight = group_link(A100, 64, 1), group_link(A100, 64, 8)
    assert eight.beta == pytest.approx(8 * one.beta)
    # NVIDIA: "8x200Gbit/s IB cards and we measure 192GB/s AllReduce BusBW" between DGX A100 nodes (nccl #1576)
    assert eight.beta == pytest.approx(192e9, rel=0.01)
    # on an H100 node the 8 NICs (384 GB/s) outrun NVLink at NCCL's 82 % (369 GB/s): NVLink caps the ring
    assert group_link(H100, 64, 8).beta == pytest.approx(H100.nvlink * EFFICIENCY["nvlink"])


def test_tp_8_leaves_the_cross_node_seconds_per_gpu_unchanged():
    # Austin et al. 2025: tp = 8 inside a node "reduce[s] the cost of the node-level reduction by 8 but leave[s]
    # the overall cost the same": 1/8 of the bytes over 1 NIC take as long as all of them over 8
    psi = 7.5e9 * 2
    fsdp = group_seconds("all_gather", psi, members=64, per_node=8, device=A100)
    two_d = group_seconds("all_gather", psi / 8, members=64, per_node=1, device=A100)
    assert two_d == pytest.approx(fsdp, rel=0.01)


@pytest.mark.parametrize("lay, axis, span", [
    (Layout(tp=8, dp=64), "dp", (64, 1)), (Layout(dp=512), "dp", (512, 8)), (Layout(tp=2, dp=32), "dp", (32, 4)),
    (Layout(tp=2, cp=2, dp=16), "dp", (32, 4)), (Layout(tp=8, pp=4, dp=2), "pp", (4, 1)),
    (Layout(tp=4, dp=2), "dp", (2, 2)), (Layout(tp=8, dp=8), "tp", (8, 8)),
])
def test_a_layouts_groups_know_their_members_per_node(lay, axis, span):
    assert lay.span(axis) == span
    members, per_node = span
    stride = {"dp": lay.tp, "pp": lay.tp * lay.cp * lay.dp, "tp": 1}[axis]
    assert lay.gpus <= 8 or members_per_node(members, stride, 8) == per_node


def test_an_all_to_all_sends_each_members_off_node_share_through_its_own_nic():
    nbytes, n = 1e9, 16
    seconds = all_to_all_seconds(nbytes, n, 8, H100)
    nic = group_link(H100, n, 1).beta
    assert seconds == pytest.approx((n - 1) * 5e-6 + 8 / 16 * nbytes / nic, rel=1e-6)


def test_fsdp_across_whole_nodes_costs_what_it_costs_on_one():
    # llm-foundry's MPT-13B: 40 % MFU at 8, 16, 32 and 64 H100s alike; one NIC per GPU priced it at 15 %
    model = MODELS["gpt-1.3b"]
    mfu = [estimate(model, Layout(dp=n, zero=3, micro_batch=2, global_batch=2 * n), "h100-sxm").mfu for n in (8, 64)]
    assert mfu[1] == pytest.approx(mfu[0], rel=0.05)


def test_the_emulated_device_prices_a_group_as_the_model_does():
    em = emulated.parse("emulated:a100,node=2")
    name, alpha, beta = em.link_of((0, 1, 2, 3))
    link = group_link(A100, 4, 2)
    assert (name, alpha, beta) == (link.fabric, link.alpha, link.beta) and name == "infiniband"
    assert em.link_of((1, 2))[2] == pytest.approx(beta / 2)          # a pair across nodes: one NIC
    assert em.link_of((0, 1))[0] == "nvlink"


def test_bad_groups_are_refused_in_one_line():
    with pytest.raises(ValueError, match="per_node must be between 1 and members"):
        group_link(H100, 4, 8)
    with pytest.raises(ValueError, match="network must be one of"):
        group_link(H100, 16, 8, network="nvlink")
