"""ZeRO-3 mechanics in one process (a world of one): every gathered buffer is freed after forward and after
backward, backward re-gathers each unit once, gradients and the full state dict equal a plain TinyGPT's.
(The multi-rank oracle — losses, bytes, traffic at 2 and 4 ranks — is in test_zero.py; any model, in
test_fsdp_generic.py.)
"""
import torch

from partrain_edu import runtime
from partrain_edu.comm import CommTracer
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import TinyGPT
from partrain_edu.parallel.fsdp import FullyShardedDataParallel


def test_units_are_freed_after_forward_and_backward_and_gradients_match_plain_autograd():
    runtime.init()
    try:
        x, y = SyntheticTokens().global_batch(0, 4)
        plain = TinyGPT()
        TinyGPT.loss(plain(x), y).backward()
        sharded = FullyShardedDataParallel(TinyGPT())           # default units: the blocks of `blocks`
        assert len(sharded.units) == 5 and [len(u.shards) for u in sharded.units] == [1] * 5
        assert [k for k, _ in sharded.named_parameters()] == [k for k, _ in plain.named_parameters()]
        with CommTracer() as tracer:
            loss = TinyGPT.loss(sharded(x), y)
            assert sharded.gathered_bytes_now == 0                       # forward freed every unit
            assert all(s.full is None for s in sharded.shards())
            forward_gathers = len(tracer.records)
            loss.backward()
        assert sharded.gathered_bytes_now == 0 and all(s.backward_full is None for s in sharded.shards())
        ops = [r.op for r in tracer.records]
        assert forward_gathers == 5 and ops.count("all_gather_single") == 10 and ops.count("reduce_scatter_single") == 5
        # each piece (a whole parameter, in a world of one) holds plain autograd's gradient, flattened
        ref = dict(plain.named_parameters())
        for name, piece in sharded.named_parameters():
            assert torch.allclose(piece.grad, ref[name].grad.reshape(-1), atol=1e-6), name
        state = sharded.state_dict()
        assert list(state) == list(TinyGPT().state_dict())
        assert all(torch.equal(state[k], p) for k, p in TinyGPT().state_dict().items())
    finally:
        runtime.shutdown()
