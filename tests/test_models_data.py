import math

import pytest
import torch

from partrain_edu.data import DataParallelSampler, SyntheticTokens, data_parallel_slice, split_microbatches
from partrain_edu.models import GPTConfig, TinyGPT, TinyMLP, count_params


def test_init_is_deterministic_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = TinyGPT(init_seed=0), TinyGPT(init_seed=0), TinyGPT(init_seed=1)
    assert torch.rand(1).item() == before.item()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.blocks[0].attn.q.weight, c.blocks[0].attn.q.weight)


def test_parameter_count_matches_the_architecture():
    cfg = GPTConfig()
    V, T, L, H = cfg.vocab_size, cfg.seq_len, cfg.n_layer, cfg.n_embd
    per_block = 4 * (H * H + H) + (H * 4 * H + 4 * H) + (4 * H * H + H) + 2 * 2 * H
    expected = V * H + T * H + L * per_block + 2 * H + H * V  # untied head, no bias
    assert count_params(TinyGPT(cfg)) == expected == 218_496


def test_untrained_model_guesses_uniformly_and_logits_have_the_right_shape():
    model = TinyGPT()
    x, y = SyntheticTokens().global_batch(0, 8)
    logits = model(x)
    assert logits.shape == (8, 32, 128)
    assert abs(TinyGPT.loss(logits, y).item() - math.log(128)) < 0.05


def test_residual_projections_use_the_smaller_gpt2_init():
    model = TinyGPT(GPTConfig(n_layer=8), init_seed=0)
    std_fc = model.blocks[0].mlp.fc.weight.std().item()
    std_proj = model.blocks[0].mlp.proj.weight.std().item()
    assert abs(std_fc - 0.02) < 0.002 and abs(std_proj - 0.02 / 4) < 0.0005


@pytest.mark.parametrize("kwargs, words", [({"n_embd": 66, "n_head": 4}, "divisible by n_head"),
                                           ({"n_layer": 0}, "positive"), ({"vocab_size": -1}, "positive")])
def test_bad_configs_name_the_fix(kwargs, words):
    with pytest.raises(ValueError, match=words):
        GPTConfig(**kwargs)


def test_too_long_sequence_is_rejected():
    with pytest.raises(ValueError, match="longer than seq_len"):
        TinyGPT()(torch.zeros(1, 33, dtype=torch.long))


def test_mlp_model():
    out = TinyMLP((4, 8, 2))(torch.ones(3, 4))
    assert out.shape == (3, 2)
    with pytest.raises(ValueError):
        TinyMLP((4,))


def test_data_is_deterministic_follows_the_chain_and_is_learnable():
    data = SyntheticTokens(seed=0)
    x1, y1 = data.global_batch(5, 16)
    x2, y2 = data.global_batch(5, 16)
    x3, _ = data.global_batch(6, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the next tokens
    next_tokens, _ = data.transition_table()
    allowed = (next_tokens[x1] == y1.unsqueeze(-1)).any(-1)  # every step follows the chain
    assert allowed.all()
    assert data.entropy() < 0.5 * math.log(128)  # far below guessing: there is something to learn


def test_data_parallel_slices_tile_the_global_batch_and_mean_losses_agree():
    data = SyntheticTokens()
    x, y = data.global_batch(0, 16)
    parts = [data_parallel_slice(x, y, r, 4) for r in range(4)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    sampler = DataParallelSampler(data, 16, dp_rank=2, dp_size=4)
    assert torch.equal(sampler.batch(0)[0], parts[2][0])
    model = TinyGPT()
    whole = TinyGPT.loss(model(x), y)
    mean_of_parts = sum(TinyGPT.loss(model(xs), ys) for xs, ys in parts) / 4
    assert torch.allclose(whole, mean_of_parts, rtol=1e-6)
    micro = split_microbatches(x, y, 4)
    assert [m[0].shape[0] for m in micro] == [4, 4, 4, 4]


@pytest.mark.parametrize("call, words", [
    (lambda x, y: data_parallel_slice(x, y, 0, 3), "not divisible by 3"),
    (lambda x, y: data_parallel_slice(x, y, 4, 4), "not in 0..3"),
    (lambda x, y: split_microbatches(x, y, 5), "cannot be cut into 5"),
])
def test_uneven_splits_are_refused(call, words):
    x, y = SyntheticTokens().global_batch(0, 16)
    with pytest.raises(ValueError, match=words):
        call(x, y)
