"""ZeRO-3 mechanics in one process (a world of one): every gathered buffer is freed after forward and after
backward, backward re-gathers each unit once, gradients and the full state dict equal a plain TinyGPT's.
(The multi-rank oracle — losses, bytes, traffic at 2 and 4 ranks — is in test_zero.py.)
"""
import torch

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.fsdp import ShardedModel


def test_units_are_freed_after_forward_and_backward_and_gradients_match_plain_autograd():
    runtime.init()
    try:
        x, y = SyntheticTokens().global_batch(0, 4)
        plain = TinyGPT()
        TinyGPT.loss(plain(x), y).backward()
        sharded = ShardedModel(TinyGPT())
        assert len(sharded.units) == 5 and list(sharded.parameters()) == list(sharded.shards)
        with CommTracer() as tracer:
            loss = TinyGPT.loss(sharded(x), y)
            assert sharded.gathered_bytes_now == 0                       # forward freed every unit
            assert all(u.full is None for u in sharded.units)
            forward_gathers = len(tracer.records)
            loss.backward()
        assert sharded.gathered_bytes_now == 0 and all(u.backward_full is None for u in sharded.units)
        ops = [r.op for r in tracer.records]
        assert forward_gathers == 5 and ops.count("all_gather_single") == 10 and ops.count("reduce_scatter_single") == 5
        # the shards' gradients, laid out like the parameters, are plain autograd's
        for unit in sharded.units:
            expected = unit.flat.flatten([dict(plain.named_parameters())[name].grad for name in _names(sharded, unit)])
            assert torch.allclose(unit.flat.shard.grad, expected, atol=1e-6)
        state = sharded.full_state_dict()
        assert sorted(state) == sorted(dict(plain.named_parameters()))
        assert all(torch.equal(state[k], p) for k, p in TinyGPT().named_parameters())
    finally:
        runtime.shutdown()


def _names(sharded, unit):
    prefix = {id(m): (n + "." if n else "") for n, m in sharded.module.named_modules()}
    return [prefix[id(m)] + name for m, name in unit.owned]
