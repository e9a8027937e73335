"""theory.moe: the formulas the MoE chapter measures against (tests/test_moe.py compares them with real runs)."""
import pytest

from partrain_edu.theory import moe


def test_capacity_rounds_up_and_is_exact_on_round_numbers():
    assert moe.capacity(64, 4, 2, 1.25) == 40           # 1.25 · 64·2/4 = 40
    assert moe.capacity(40, 4, 1, 1.1) == 11            # 11.000000000000002 in floats: still 11
    assert moe.capacity(10, 4, 1, 1.0) == 3             # ⌈2.5⌉
    with pytest.raises(ValueError, match="capacity_factor"):
        moe.capacity(10, 4, 1, 0)


def test_dropped_is_the_load_over_capacity():
    assert moe.kept_rows([23, 0, 0, 1], 8) == [8, 0, 0, 1]
    assert moe.dropped([23, 0, 0, 1], 8) == 15
    assert moe.dropped([23, 0, 0, 1], None) == 0        # dropless


def test_switch_aux_loss_is_alpha_when_balanced_and_grows_with_skew():
    uniform = [0.25] * 4
    assert moe.switch_aux_loss(uniform, uniform, alpha=0.01) == pytest.approx(0.01)
    assert moe.switch_aux_loss([1, 0, 0, 0], [0.9, 0.05, 0.03, 0.02], alpha=0.01) == pytest.approx(0.036)
    with pytest.raises(ValueError, match="one entry per expert"):
        moe.switch_aux_loss([0.5, 0.5], [1.0])


def test_imbalance_is_max_over_mean():
    assert moe.imbalance([16, 16, 16, 16]) == 1
    assert moe.imbalance([95, 0, 0, 1]) == 95 * 4 / 96
    with pytest.raises(ValueError):
        moe.imbalance([0, 0])


def test_all_to_all_bytes():
    assert moe.dispatch_bytes([23, 0, 0, 1], 0, 16) == 1 * 16 * 4       # only the row that leaves rank 0
    assert moe.balanced_dispatch_bytes(4, 24, 1, 16) == 3 * 24 * 16      # (n−1)/n · N·k·H·4
    # padded: E·C slots per rank, the other ranks' E/n experts' share leaves, whatever the router did
    assert moe.padded_dispatch_bytes(4, 4, 8, 16) == 3 * 1 * 8 * 16 * 4


def test_expert_parallel_groups_are_ep_innermost():
    assert moe.ep_dp_groups(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert moe.ep_dp_groups(8, 8) == ([list(range(8))], [[r] for r in range(8)])
    with pytest.raises(ValueError, match="divisors"):
        moe.ep_dp_groups(6, 4)
