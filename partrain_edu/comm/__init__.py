"""What the ranks send: every ``torch.distributed`` call recorded, and priced by the ring cost model.

| module       | what it holds                                                                          |
|--------------|----------------------------------------------------------------------------------------|
| `tracer`     | `CommTracer`, `CommRecord`: ``with CommTracer() as tracer:`` records each call          |
| `costs`      | one rule per op: payload S, bytes sent and received (a map onto `theory.traffic`)      |
| `patch`      | wrapping torch.distributed's functions, the one way the tracer, call records and emulated links do it |
| `ddp_hook`   | what the patch cannot see (1): PyTorch DDP's C++ all-reduce, through a comm hook      |
| `adapters`   | what the patch cannot see (2): DTensor/FSDP2's functional collectives                 |

    from partrain_edu.comm import CommTracer
"""
from partrain_edu.comm.tracer import CommRecord, CommTracer

__all__ = ["CommRecord", "CommTracer"]
