"""theory.batch_limit: the batch caps the data-parallel degree; FSDP's intensity is its tokens per replica, and
across whole nodes it needs about 2,500 tokens per GPU whatever tp (the Scaling Book's GPU chapter)."""
import pytest

from partrain_edu.theory.batch_limit import (
    critical_tokens,
    fsdp_intensity,
    fsdp_tokens_per_gpu,
    hardware_intensity,
    max_dp_for_batch,
    min_tp_for_batch,
)
from partrain_edu.theory.hardware import DEVICES
from partrain_edu.theory.network import group_link
from partrain_edu.theory.planner import plan

H100, A100 = DEVICES["h100"], DEVICES["a100"]


def test_the_batch_caps_data_parallelism_and_the_rest_must_be_tensor_parallel():
    assert max_dp_for_batch(1024) == 1024 and max_dp_for_batch(1024, 4) == 256 and max_dp_for_batch(10, 3) == 3
    assert max_dp_for_batch(2, 3) == 0                             # not even one replica of 3 sequences
    assert min_tp_for_batch(512, 1024) == 1                        # enough batch: pure data parallel
    assert min_tp_for_batch(4096, 1024) == 4 and min_tp_for_batch(4096, 1024, 2) == 8
    assert min_tp_for_batch(24, 8) == 3                            # a divisor of the GPUs, not a power of two
    with pytest.raises(ValueError, match="add pipeline stages or a bigger batch"):
        min_tp_for_batch(4096, 256)
    with pytest.raises(ValueError, match="global_batch must be a positive number"):
        max_dp_for_batch(0)


def test_fsdp_intensity_is_tokens_per_replica_whatever_the_model_and_tp():
    t, n = 8 * 2048, 64
    exact = 2 * t * n / ((n - 1) * 2)                              # 6Ψt / (3(n−1)/n·Ψ·2 bytes)
    for params, tp in [(1_342_177_280, 1), (13_421_772_800, 1), (13_421_772_800, 8)]:
        assert fsdp_intensity(params, t, n, tp) == pytest.approx(exact, rel=1e-8)
    assert fsdp_intensity(10**9, 2 * t, n) == pytest.approx(2 * fsdp_intensity(10**9, t, n), rel=1e-8)
    assert fsdp_intensity(10**9, t, n, bytes_per_element=4) == pytest.approx(exact / 2, rel=1e-8)
    with pytest.raises(ValueError, match="pass dp >= 2"):
        fsdp_intensity(10**9, t, 1)


def test_the_critical_tokens_make_a_large_group_exactly_as_intense_as_its_link():
    need = critical_tokens(H100.peak_flops, H100.nic)             # InfiniBand: 989e12 / 50e9 ≈ 19.8k tokens
    assert need == pytest.approx(989e12 / 50e9) and hardware_intensity(H100.peak_flops, H100.nic) == need
    assert critical_tokens(H100.peak_flops, H100.nvlink) == pytest.approx(need / 9)   # NVLink: 9× the bytes/s
    assert critical_tokens(1.0, 1.0, bytes_per_element=4) == 2.0                     # fp32: twice the tokens
    big = fsdp_intensity(10**9, need, 10**6)                       # (n−1)/n → 1
    assert big == pytest.approx(hardware_intensity(H100.peak_flops, H100.nic), rel=1e-5)


def test_the_planner_leaves_pure_data_parallelism_as_the_batch_shrinks():
    big, small = (plan("7.5B", 256, "80GB", global_batch=b).layout for b in (4096, 64))
    assert big.strategy in ("ddp", "fsdp") and (big.dp, big.tp) == (256, 1)     # pure data parallel, ZeRO or not
    assert small.tp * small.pp > 1 and small.dp * small.tp * small.pp == 256      # model parallel: tp or pp
    assert small.dp <= max_dp_for_batch(64) and small.tp * small.pp >= min_tp_for_batch(256, 64, max_tp=8)


def test_fsdp_across_whole_h100_nodes_needs_about_2500_tokens_per_gpu():
    """The Scaling Book's GPU chapter: "about 2500 tokens per GPU"; within 25 %, at peak, NCCL's efficiencies."""
    assert fsdp_tokens_per_gpu(H100) == pytest.approx(2500, rel=0.25)
    assert fsdp_tokens_per_gpu("h100-sxm") == fsdp_tokens_per_gpu(H100)
    datasheet = critical_tokens(H100.peak_flops, 8 * H100.nic)     # the node's 8 NICs, no efficiency
    assert datasheet == pytest.approx(2473, rel=1e-3) and datasheet == pytest.approx(2500, rel=0.25)
    assert fsdp_tokens_per_gpu(H100, flops=H100.peak_flops / 2) == pytest.approx(fsdp_tokens_per_gpu(H100) / 2)
    with pytest.raises(ValueError, match="tp must divide"):
        fsdp_tokens_per_gpu(H100, tp=3)


@pytest.mark.parametrize("device", [H100, A100])
def test_the_tokens_per_gpu_do_not_depend_on_tp(device):
    """tp× the tokens per replica on 1/tp of the node's NICs: the same tokens per GPU (NVLink caps H100's tp = 1
    group at 369 GB/s, below its 8 NICs' 384: 4 % more there, the only difference)."""
    need = [fsdp_tokens_per_gpu(device, tp) for tp in (1, 2, 4, 8)]
    assert max(need) == pytest.approx(min(need), rel=0.05)
    assert need[1:] == pytest.approx([need[-1]] * 3, rel=1e-12)


def test_a_group_with_8_members_per_node_crosses_nodes_on_8_nics():
    """A100: NIC-bound, exactly 8× the bandwidth of a group with one member per node. H100: NVLink's 0.82 × 450 =
    369 GB/s caps the 8 NICs' 0.96 × 8 × 50 = 384, so 7.7×."""
    assert group_link(A100, 64, 8).beta == pytest.approx(8 * group_link(A100, 64, 1).beta)
    h8, h1 = group_link(H100, 64, 8).beta, group_link(H100, 64, 1).beta
    assert h8 == pytest.approx(0.82 * 450e9) and h1 == pytest.approx(0.96 * 50e9)
    assert h8 / h1 == pytest.approx(369 / 48, rel=1e-3)
