"""Bytes on the fullest GPU of a layout: its stage's parameters and states, activations in flight, buffers.

    fullest_stage(MODELS["bloom-176b"], Layout(tp=4, pp=12, dp=8, zero=1, micro_batch=2, recompute="full"))

**States** per parameter (Rajbhandari et al. 2020): bf16 weights 2 B, gradients `grad_bytes` (fp32 main grads 4;
DeepSpeed's BF16 optimizer bf16 + fp32, 6), Adam's fp32 master and moments 12 B; ZeRO-1 shards the 12 over dp·cp,
ZeRO-2 the gradients too, ZeRO-3 keeps 16 B sharded and gathers two bf16 units. A stage holds its layers over tp
(experts over ep), the first the embedding, the last the head (a copy when tied). **Activations** per layer and
token (Korthikanti et al. 2022, Table 2, widened to GQA, gated MLPs and MoE): 8h + 2h dropout masks not split by tp
unless sequence parallel; Q 2h, K and V 2·kv·d, the projection's input 2h, the MLP's 4f (6f gated) split; the s×s
core 5as unless flash or selective recompute; with all-gather CP the other ranks' K and V, 4·kv·d·(c − 1); full
recompute keeps the 2h input. Stage i of 1F1B holds min(p − i, m) micro-batches, interleaving × (1 + (p−1)/(pv))
(Korthikanti §4.2.3). **Buffers**: fp32 logits on the last stage, a layer being recomputed, and what no tensor of
the model holds (`headroom_bytes`): the CUDA context with cuBLAS's workspaces, NCCL's buffers for each group the GPU
talks in, and the caching allocator's fragmentation, a share of the bytes that come and go (activations, gathered
units). These three are assumptions stated as such, not measurements: real runs report reserved memory, which
the allocator grows into what is free (torchtitan's 8B on 8 GPUs reserves 82 GiB of 95), so a published figure
is an upper bound on the need. `estimate` and `plan` mark a layout above `TIGHT` of the HBM.
"""
from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.theory.layout import Layout, stage_layers
from partrain_edu.theory.model_spec import ModelSpec

CONTEXT_BYTES = 0.75e9         # CUDA context, cuBLAS and cuDNN workspaces, the framework's own tensors (assumed)
# NCCL's buffers per communicator: NCCL_BUFFSIZE's default 4 MiB for Simple, about as much for LL128 and a little
# for LL, to each of a ring's 2 peers, send and receive, on up to 16 channels: 16 × 2 × 9 MiB ≈ 0.3 GB (NCCL's
# environment-variable documentation gives the 4 MiB; the channel count is NVLink's usual, assumed)
NCCL_BYTES_PER_GROUP = 0.3e9
FRAGMENTATION = 0.05           # the caching allocator's reserved-but-unused share of transient bytes (assumed)
TIGHT = 0.9                    # above this share of the HBM a layout leaves no room for spikes: flagged


def headroom_bytes(lay: Layout, transient: float) -> float:
    """What no tensor of the model holds: the context, NCCL per group of more than one GPU, fragmentation."""
    groups = sum(n > 1 for n in (lay.tp, lay.pp, lay.cp, lay.dp * lay.cp, lay.ep))
    return CONTEXT_BYTES + NCCL_BYTES_PER_GROUP * groups + FRAGMENTATION * transient


@dataclass(frozen=True)
class StageMemory:
    stage: int
    params: float            # parameters this GPU holds (before ZeRO sharding)
    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    def to_dict(self) -> dict:
        return {"stage": self.stage, "weights": round(self.weights), "grads": round(self.grads),
                "optimizer": round(self.optimizer), "activations": round(self.activations),
                "buffers": round(self.buffers), "total": round(self.total)}


def layer_params_on_gpu(model: ModelSpec, lay: Layout) -> tuple[float, float]:
    """(dense, expert) parameters of one average layer on one GPU: matrices over tp, experts over ep too."""
    moe_share = model.n_moe / model.layers
    dense = (1 - moe_share) * model.dense_layer_params() + moe_share * model.moe_layer_params(active=False)
    experts = moe_share * model.experts * model.mlp_params(model.expert_width) if model.experts else 0.0
    return (dense - experts) / lay.tp, experts / (lay.tp * lay.ep)


def stage_params(model: ModelSpec, lay: Layout, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters stage `stage` holds on one GPU, with the embedding on the first and the head
    (or, tied, a copy of the embedding for the logits: Megatron) on the last."""
    layers = stage_layers(model.layers, lay.pp)[stage]
    dense, experts = layer_params_on_gpu(model, lay)
    dense *= layers
    if stage == 0:
        dense += model.embedding_params() / lay.tp
    if stage == lay.pp - 1 and (lay.pp > 1 or not model.tied_embeddings):
        dense += (model.head_params() or model.vocab * model.hidden) / lay.tp
    return dense, experts * layers


def activation_bytes_per_token(model: ModelSpec, lay: Layout, recompute: str | None = None) -> float:
    """Bytes one layer keeps per token of this GPU's micro-batch (the module docstring's terms, mean over MoE)."""
    h = model.hidden
    kv = model.kv_dim
    f = model.ffn_width
    tp = lay.tp
    recompute = recompute or lay.recompute
    sp = tp if lay.sp else 1
    if recompute == "full":
        return 2 * h / sp
    if recompute == "selective-op":   # the input, attention's output, every other matmul's output (torchtitan)
        up = (4 if model.gated else 2) * f
        outputs = (2 * h + 4 * kv + up) / tp + 2 * h / sp + 2 * h / sp    # QKV, MLP in; projection, MLP out
        return 2 * h / sp + 2 * h / tp + outputs / 2 + (2 * h / sp if model.dropout else 0)
    mats = 6 if model.gated else 4
    moe_share = model.n_moe / model.layers
    mlp = (1 - moe_share) * mats * f + moe_share * (model.top_k + model.shared_experts) * mats * model.expert_width
    split = 2 * h + 4 * kv + 2 * h + mlp
    core = 0 if lay.flash_attention or recompute == "selective" else 5 * model.heads * model.seq
    masks = 2 * h if model.dropout else 0                                  # two 1-byte masks per token
    if core and not model.dropout:                                          # no s×s mask either
        core -= model.heads * model.seq
    gathered = 4 * kv * (lay.cp - 1)   # all-gather CP keeps the rest of the sequence's K and V (Llama 3)
    return (8 * h + masks) / sp + (split + core + gathered) / tp


def in_flight(lay: Layout, stage: int) -> float:
    """Micro-batches whose activations stage `stage` holds at its fullest (1F1B; interleaved: ×(1 + (p−1)/(pv)))."""
    m, p = lay.microbatches, lay.pp
    held = min(p - stage, m)
    if lay.pipeline_schedule == "interleaved":
        held *= 1 + (p - 1) / (p * lay.vpp)
    return held


def stage_memory(model: ModelSpec, lay: Layout, stage: int = 0) -> StageMemory:
    """Bytes on one GPU of pipeline stage `stage` (the module docstring's terms)."""
    dense, experts = stage_params(model, lay, stage)
    shard = lay.dp * lay.cp                        # ZeRO shards over every replica of these weights
    expert_shard = max(1, shard // lay.ep)
    sharded = dense / shard + experts / expert_shard
    held = dense + experts
    if lay.zero == 3:
        weights = 4 * sharded
        grads = 4 * sharded
        optimizer = 8 * sharded
    else:
        weights = 2 * held
        grads = lay.grad_bytes * (sharded if lay.zero == 2 else held)
        optimizer = 12 * (sharded if lay.zero >= 1 else held)
    tokens = lay.micro_batch * model.seq / lay.cp
    layers = stage_layers(model.layers, lay.pp)[stage]
    activations = activation_bytes_per_token(model, lay) * tokens * layers * in_flight(lay, stage)
    buffers = 0.0
    if stage == lay.pp - 1:                        # the logits of one micro-batch, fp32 for the loss
        buffers += 4 * tokens * model.vocab / lay.tp
    if lay.recompute in ("full", "selective-op"):  # one layer's activations while it is recomputed
        buffers += activation_bytes_per_token(model, lay, "none") * tokens
    if lay.zero == 3:                              # the gathered unit and the prefetched next one
        buffers += 2 * 2 * (dense + experts) / max(1, layers)
    buffers += headroom_bytes(lay, activations + buffers)
    return StageMemory(stage, held, weights, grads, optimizer, activations, buffers)


def fullest_stage(model: ModelSpec, lay: Layout) -> StageMemory:
    """The stage whose GPU needs the most bytes (the first holds the most activations, the last the logits)."""
    stages = {0, lay.pp - 1} | ({1} if lay.pp > 2 else set())
    return max((stage_memory(model, lay, s) for s in stages), key=lambda m: m.total)
