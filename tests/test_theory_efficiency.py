"""theory.efficiency: FLOPs per token against PyTorch's own FLOP counter on TinyGPT, the roofline, and each parallel
axis's communication/compute ratio against the scaling laws it should follow (Austin et al. 2025)."""
from __future__ import annotations

import pytest

from partrain_edu.theory.efficiency import (
    AXES,
    arithmetic_intensity,
    attainable_flops,
    axis_cost,
    flops_per_token,
    kaplan_flops_per_token,
    matmul_bytes,
    matmul_flops,
    ridge_point,
    roofline_seconds,
    utilization,
)
from partrain_edu.theory.hardware import DEVICES, GPT_1_3B, ModelShape
from partrain_edu.theory.memory import gpt_param_count
from partrain_edu.theory.traffic import step_traffic

SIZES = dict(layers=24, hidden=2048, seq=2048, vocab=50257, micro_batch=4)


def test_flop_counter_counts_the_formula_on_tinygpt_with_and_without_recompute():
    """FlopCounterMode counts matmuls only (2 FLOPs per multiply-add), forward and backward, as the formula does.
    SDPA's CPU kernel has no FLOP formula in PyTorch, so attention runs the math backend (plain bmm) to be seen;
    full recompute must turn off torch's early stop, which skips re-running each block's last matmul."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop
    from torch.utils.flop_counter import FlopCounterMode

    from partrain_edu.models import TinyGPT

    model = TinyGPT()
    cfg = model.cfg
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))

    def per_token(recompute: bool, backend=SDPBackend.MATH) -> float:
        with sdpa_kernel(backend), set_checkpoint_early_stop(False), FlopCounterMode(display=False) as counter:
            x = model.wte(idx) + model.wpe(torch.arange(cfg.seq_len))
            for block in model.blocks:
                x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
            model.loss(model.head(model.ln_f(x)), idx).backward()
        return counter.get_total_flops() / idx.numel()

    shape = ModelShape("TinyGPT", cfg.n_layer, cfg.n_embd, cfg.seq_len)
    assert per_token(False) == flops_per_token(shape, cfg.vocab_size)
    assert per_token(True) == flops_per_token(shape, cfg.vocab_size, recompute="full")
    # the default CPU kernel is invisible to the counter: exactly attention's 12·l·s·h per token is missing
    attention = 12 * cfg.n_layer * cfg.seq_len * cfg.n_embd
    assert per_token(False, SDPBackend.FLASH_ATTENTION) == flops_per_token(shape, cfg.vocab_size) - attention


def test_six_psi_misses_attention_and_counts_parameters_that_are_no_matmul():
    params = gpt_param_count(GPT_1_3B.layers, GPT_1_3B.hidden, 50257, GPT_1_3B.seq)
    L, h, s = GPT_1_3B.layers, GPT_1_3B.hidden, GPT_1_3B.seq
    no_matmul = 13 * L * h + s * h + 2 * h          # biases, LayerNorms, positions (the tied embedding is the head)
    assert flops_per_token(GPT_1_3B, 50257) - kaplan_flops_per_token(params) == 12 * L * s * h - 6 * no_matmul
    assert kaplan_flops_per_token(params, recompute=True) / kaplan_flops_per_token(params) == pytest.approx(4 / 3)
    # the head is not recomputed, so the 4th pass adds a little less than a third
    full, none = flops_per_token(GPT_1_3B, 50257, "full"), flops_per_token(GPT_1_3B, 50257)
    assert 1.3 < full / none < 4 / 3
    assert none < flops_per_token(GPT_1_3B, 50257, "selective") < full
    with pytest.raises(ValueError, match="recompute must be one of"):
        flops_per_token(GPT_1_3B, 50257, "half")


def test_mfu_and_hfu_share_the_tokens_per_second_and_differ_by_the_recompute():
    h100 = DEVICES["h100"]
    model, hardware = flops_per_token(GPT_1_3B, 50257), flops_per_token(GPT_1_3B, 50257, "full")
    at_peak = 8 * h100.peak_flops / model            # tokens/s that 8 GPUs reach at 100 % MFU
    assert utilization(model, at_peak / 2, 8, h100.peak_flops) == pytest.approx(0.5)
    assert utilization(hardware, at_peak / 2, 8, h100.peak_flops) == pytest.approx(0.5 * hardware / model)
    with pytest.raises(ValueError, match="devices must be a positive number"):
        utilization(model, 1.0, 0, h100.peak_flops)


def test_roofline_ridge_points_and_the_tokens_a_matmul_needs_to_be_compute_bound():
    a100, h100 = DEVICES["a100"], DEVICES["h100"]
    assert ridge_point(a100) == pytest.approx(153, abs=1) and ridge_point(h100) == pytest.approx(295, abs=1)
    assert arithmetic_intensity(3000, 3000, 3000, 2) == pytest.approx(1000)     # a square bf16 matmul: n/3
    assert attainable_flops(ridge_point(h100), h100) == pytest.approx(h100.peak_flops)
    # one token through a weight is memory-bound: the time is the weight's bytes over HBM bandwidth
    assert roofline_seconds(matmul_flops(1, 8192, 8192), matmul_bytes(1, 8192, 8192), h100) == \
        pytest.approx(matmul_bytes(1, 8192, 8192) / h100.hbm)
    # m tokens through an h×h bf16 weight: intensity ≈ m, so m must pass the ridge point (≈ 295 on an H100)
    assert arithmetic_intensity(200, 8192, 8192) < ridge_point(h100) < arithmetic_intensity(400, 8192, 8192)


def test_each_axis_ratio_follows_its_scaling_law():
    dp = {b: axis_cost("dp", 8, **{**SIZES, "micro_batch": b}) for b in (4, 8)}
    assert dp[4].bytes_sent == step_traffic("ddp", gpt_param_count(24, 2048, 50257, 2048), dp=8).per_rank_bytes_sent
    assert dp[8].ratio == pytest.approx(dp[4].ratio / 2, rel=0.01)   # twice the tokens, the same gradients
    # TP sends activations, b·s·h, for compute ∝ b·s·h²/n: the ratio grows with n and falls with h
    tp = {(n, h): axis_cost("tp", n, **{**SIZES, "hidden": h}).ratio for n in (2, 8) for h in (2048, 8192)}
    assert tp[8, 2048] > 3 * tp[2, 2048] and tp[8, 8192] < tp[8, 2048] / 3
    # ring attention sends K and V three times (forward, and K, V with their gradients backward): 3/4 of TP's bytes
    assert axis_cost("cp", 8, **SIZES).bytes_sent / axis_cost("tp", 8, **SIZES).bytes_sent == pytest.approx(0.75)
    # a stage boundary's activations are the least any axis sends; 10 GbE makes data parallelism wait
    assert min(AXES, key=lambda axis: axis_cost(axis, 8, **SIZES).ratio) == "pp"
    assert axis_cost("dp", 8, link="10gbe", **SIZES).ratio > 10 * axis_cost("dp", 8, **SIZES).ratio > 1
    with pytest.raises(ValueError, match="axis must be one of"):
        axis_cost("ep", 8, **SIZES)
    with pytest.raises(ValueError, match="needs at least 32 layers"):
        axis_cost("pp", 32, **SIZES)
