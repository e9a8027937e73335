"""The library: data, tensor, pipeline, context and expert parallelism on torch.distributed, one piece per file.

Nothing here imports the course harness (`partrain_edu.train`, `partrain_edu.cli`, `partrain_edu.strategies`,
`partrain_edu.models`): every piece wraps any nn.Module. The strategies `partrain-edu train` runs are built from
these pieces in `partrain_edu.strategies`, whose index says which strategy wraps which piece. Groups are passed
explicitly (`ctx.group("tp")` from `runtime.init(dp=…, tp=…, pp=…)`); `group=None` means the whole world.

| module     | pieces                                                | shards / sends                       |
|------------|-------------------------------------------------------|--------------------------------------|
| ring       | ring_reduce_scatter, ring_all_gather, ring_all_reduce, ring_neighbours | — / 2(n−1) steps of 1/n |
| buckets    | Bucket, plan_buckets, GradBucketHooks, OncePerBackward, allreduce_mean | — / gradients in flat buckets |
| ddp        | DistributedDataParallel, allreduce_per_parameter      | nothing / averaged gradients         |
| flat_shard | FlatShard, by_dtype                                   | a flat buffer, one chunk per rank    |
| zero_naive | NaiveZero: ZeRO-1/2 on one flat buffer, 80 lines     | optimizer states (+ grads) / RS, AG  |
| zero       | ZeroOptimizer (ZeRO-1/2)                              | optimizer states (+ grads) / RS, AG  |
| zero_state | ZeroOptimizer's single-process state dict, mirror_hyperparameters | — / AG of the states |
| fsdp_naive | NaiveFSDP: ZeRO-3, the whole model one unit, 80 lines | + parameters / AG, AG, RS            |
| fsdp       | FullyShardedDataParallel, MixedPrecision (ZeRO-3)     | + parameters / gathers per unit      |
| fsdp_unit  | Unit, UnitShard, _Gather: one unit's gather mechanics | + parameters / AG, AG, RS per unit   |
| fsdp_layout | choose_units, shard_units, registered (which unit owns which parameter) | — / nothing  |
| fsdp_state | summon_full_params, full_state_dict, load_full_state_dict | — / AG of every shard  |
| tp_comm    | Megatron's f and g, and the sequence pair             | — / all-reduce, gather, RS           |
| tensor     | parallelize(module, plan, region), check_plan         | weight matrices / 4 all-reduces      |
| sequence   | SequenceParallelRegion, layer_activation_bytes        | + activations / the same bytes       |
| saved_bytes | SavedBytes: activation bytes autograd saves (live, peak, kept) | — / nothing (a meter)      |
| torch_tp   | dtensor_plan (our plan in DTensor's styles)           | as tensor, by DTensor                |
| pp_comm    | Mailbox, Boundary, agree_on_shapes                    | — / activations, gradients (p2p)     |
| pipeline   | PipelineExecutor, Stage, split_layers                 | layers / one schedule's messages     |
| zero_bubble | SplitBackward, backward_input, backward_weight (ZB-H1's B and W) | — / 1F1B's messages    |
| hybrid     | dp_average_gradients, traffic_by_dimension            | 3D: dp all-reduce; bytes per dim     |
| moe        | MoE, ExpertParallelMoE, expert_parallel_groups        | experts / 2 all-to-alls each way; DP |
| moe_routing | route, Routing, within_capacity (top-k, capacity, aux loss) | — / nothing (one rank's tokens) |
| context    | RingAttention, Sharding (context parallelism, zig-zag) | sequence / K, V around the ring      |
| mixed_precision | MixedPrecision, LowPrecisionCopy, cast_floating   | — / bf16: half the bytes, fp32 master |
| clipping   | clip_grad_norm_tp, LocalGrad (the wrappers' clip_grad_norm_) | — / one all-reduce of Σ‖g‖²  |
RS: reduce-scatter, AG: all-gather. The *_naive files are the algorithm alone: read them before the wrappers.
The wrappers are named here too, as `torch.distributed.fsdp` names its own:
`from partrain_edu.parallel import FullyShardedDataParallel, ZeroOptimizer, parallelize` (docs/pytorch_semantics.md).
"""
import importlib

# Submodules, imported on use: `import partrain_edu.parallel` stays free of torch.
__all__ = ["buckets", "clipping", "context", "ddp", "flat_shard", "fsdp", "fsdp_layout", "fsdp_naive", "fsdp_state",
           "fsdp_unit", "hybrid", "mixed_precision", "moe", "moe_routing", "pipeline", "pp_comm", "ring", "saved_bytes",
           "sequence", "tensor", "torch_tp", "tp_comm", "zero", "zero_bubble", "zero_naive", "zero_state"]
# The names a PyTorch user imports from the package, and the submodule each lives in (loaded on first use).
EXPORTS = {"DistributedDataParallel": "ddp", "ZeroOptimizer": "zero", "FullyShardedDataParallel": "fsdp",
           "MixedPrecision": "mixed_precision", "parallelize": "tensor", "TensorParallelRegion": "tensor",
           "SequenceParallelRegion": "sequence", "PipelineExecutor": "pipeline", "RingAttention": "context",
           "ExpertParallelMoE": "moe", "MoE": "moe", "clip_grad_norm_tp": "clipping", "NaiveZero": "zero_naive",
           "NaiveFSDP": "fsdp_naive"}


def __getattr__(name: str):
    """`partrain_edu.parallel.FullyShardedDataParallel` (and the submodules) import their module on first use."""
    if name in EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{EXPORTS[name]}"), name)
    elif name in __all__:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value                                 # found once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, *EXPORTS})
