"""The course's strategies: each builds TinyGPT, wraps it with `partrain_edu.parallel`'s pieces, and takes a step.

    partrain-edu train --strategy NAME --nproc N [--dp D --tp T --pp P --microbatches M] --json

| strategy       | module               | wraps (a parallel/ piece)        | shards / sends                            |
|----------------|----------------------|----------------------------------|-------------------------------------------|
| single         | strategies.single    | —                                | nothing / nothing (the oracle)            |
| naive-dp       | strategies.naive_dp  | — (threads of one process)       | nothing / everything through device 0     |
| ddp            | strategies.ddp       | ddp.DistributedDataParallel      | batch / grad all-reduce, in buckets       |
| ddp-naive      | strategies.ddp       | ddp.allreduce_per_parameter      | batch / one all-reduce per gradient       |
| torch-ddp      | strategies.torch_ddp | torch's DistributedDataParallel  | batch / grad all-reduce, in buckets       |
| zero1          | strategies.zero      | zero.ZeroOptimizer(stage=1)      | optimizer states / reduce-scatter, gather |
| zero2          | strategies.zero      | zero.ZeroOptimizer(stage=2)      | + gradients / reduce-scatter, all-gather  |
| zero3          | strategies.fsdp      | fsdp.FullyShardedDataParallel    | + parameters / 3 collectives per unit     |
| torch-fsdp     | strategies.torch_fsdp | torch's fully_shard             | + parameters / 3 collectives per unit     |
| tp             | strategies.tensor    | tensor.parallelize               | weight matrices / 4 all-reduces per layer |
| tp-sp          | strategies.tensor    | sequence.SequenceParallelRegion  | + activations / gathers, reduce-scatters  |
| torch-tp       | strategies.torch_tp  | torch_tp.dtensor_plan            | weight matrices / 4 all-reduces per layer |
| pp-naive       | strategies.pipeline  | pipeline.PipelineExecutor        | layers / activations, their gradients     |
| pp-gpipe       | strategies.pipeline  | pipeline.PipelineExecutor        | layers / activations, their gradients     |
| pp-1f1b        | strategies.pipeline  | pipeline.PipelineExecutor        | layers / activations, their gradients     |
| pp-interleaved | strategies.pipeline  | pipeline.PipelineExecutor        | 2 chunks of layers / the same             |
| pp-zb1         | strategies.pipeline  | pipeline.PipelineExecutor (B, W) | layers / activations, their gradients     |
| torch-pp       | strategies.torch_pp  | torch's Schedule1F1B             | layers / activations, their gradients     |
| torch-pp-zb    | strategies.torch_pp  | torch's ScheduleInterleavedZeroBubble | layers / activations, gradients |
| 3d             | strategies.hybrid    | hybrid grid + tensor + pipeline  | all three / each in its own group         |
| 3d-mesh        | strategies.hybrid    | the same, on init_device_mesh    | all three / each in its own group         |
| cp             | strategies.context   | context.RingAttention            | sequence / K, V blocks around the ring    |
| fsdp-tp        | strategies.fsdp_tp   | fsdp over dp + tensor over tp    | params on dp, matrices on tp / both       |
| torch-fsdp-tp  | strategies.fsdp_tp   | fully_shard + parallelize_module | the same, by FSDP2 and DTensor            |
| ddp-bf16       | strategies.mixed_precision | ddp with bf16 communication | batch / bf16 gradient all-reduce       |
| zero3-bf16     | strategies.mixed_precision | fsdp.MixedPrecision(bf16)   | + parameters / bf16 gathers, RS        |
| torch-fsdp-bf16 | strategies.mixed_precision | torch's MixedPrecisionPolicy | the same, by FSDP2                    |

`tests/test_layering.py` checks that this table and the registry agree.
"""
from partrain_edu.strategies.base import (
                                          LEARNING_RATE,
                                          STRATEGIES,
                                          STRATEGY_MODULES,
                                          Strategy,
                                          data_parallel_batch,
                                          get_strategy,
                                          register,
                                          strategies,
                                          tensor_bytes,
)

__all__ = ["LEARNING_RATE", "STRATEGIES", "STRATEGY_MODULES", "Strategy", "data_parallel_batch", "get_strategy",
           "register", "strategies", "tensor_bytes"]
