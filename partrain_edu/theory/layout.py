"""A layout: how one training step of a model is spread over GPUs — the degrees, the batch, the recompute.

    Layout(tp=8, pp=16, dp=64, micro_batch=1, global_batch=2048, recompute="none", zero=3).check(MODELS["llama3-405b"])

gpus = tp·pp·cp·dp; expert parallelism (ep) is carved out of the dp·cp ranks, as in Megatron-Core (its rank order
tp-cp-ep-dp-pp, innermost first: `theory.grid`), so a group's block of consecutive ranks — and whether it stays
inside a node (NVLink) or crosses the network — is tp for tp, tp·cp for cp, tp·cp·ep for ep, tp·cp·dp for dp;
`span` says how many of a group's members share each node, which is what its collectives cost (`theory.network`).
Each replica runs m = global_batch / (dp·micro_batch) micro-batches per step. **Uneven stages** (70 layers on 12
stages, 126 on 16): every stage gets ⌈l/p⌉ layers and the shortfall is taken from the first and last stages first,
which also hold the embedding and the logits (Llama 3, Dubey et al. 2024 §3.3.2; DeepSpeed's BLOOM partition).
"""
from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.theory.model_spec import RECOMPUTE, ModelSpec
from partrain_edu.theory.network import members_per_node

SCHEDULES = ("1f1b", "interleaved", "zb-h1")
# The attention kernel: FlashAttention 3 (Hopper), 2 or 1 (Dao et al. 2022, 2023; Shah et al. 2024), or unfused
# products that materialise the s×s scores (Megatron-LM 2021's fused softmax). Rates: `calibration.flash_fraction`.
ATTENTION = ("flash3", "flash2", "flash1", "unfused")
# the fields that say what a framework does, not how the step is split: `estimate`'s and `plan`'s stack flags, and
# what the planner borrows from a published run
STACK = ("attention", "sequence_parallel", "grad_bytes", "overlap_dp", "overlap_param_gather", "tp_comm_overlap",
         "network_gbps")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    vpp: int = 1                     # model chunks per pipeline stage (interleaved 1F1B when > 1)
    zero: int = 0                    # 0 replicated, 1 optimizer, 2 + gradients, 3 + parameters (FSDP) over dp·cp
    micro_batch: int = 1             # sequences per micro-batch
    global_batch: int = 0            # sequences per step; 0: one micro-batch per replica
    recompute: str = "none"
    schedule: str = ""               # "", or one of SCHEDULES ("" → interleaved when vpp > 1, else 1f1b)
    sequence_parallel: bool = True   # Korthikanti et al. 2022: with tp > 1, norms and dropout split by sequence
    attention: str = "flash2"        # one of ATTENTION; any flash kernel keeps no s×s scores (Dao et al. 2022)
    gpus_per_node: int = 8
    network_gbps: float = 0.0        # the cluster's network per GPU in Gb/s; 0: the device preset's NIC (DGX)
    grad_bytes: int = 4              # per gradient held and reduced: 4 fp32 main grads (Megatron-Core); 2 fp16
                                     # (Megatron-LM 2021's default); 6 DeepSpeed's BF16 optimizer (reduces the fp32 4)
    overlap_dp: bool = True          # gradients reduced during backward (PyTorch DDP/FSDP, Megatron-Core); False:
                                     # after it (Megatron-LM 2021's local DDP, DeepSpeed's pipeline engine)
    overlap_param_gather: bool = False   # ZeRO-1/2's all-gather of updated weights hidden in the next step's
                                     # forward (Megatron-Core --overlap-param-gather); False: exposed after the step
    tp_comm_overlap: bool = False    # TP's collectives run beside the GEMMs that need them (Megatron-Core
                                     # --tp-comm-overlap, NeMo's userbuffers, torchtitan's async TP); False: exposed

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def batch(self) -> int:
        return self.global_batch or self.dp * self.micro_batch

    @property
    def microbatches(self) -> int:
        return self.batch // (self.dp * self.micro_batch)

    @property
    def pipeline_schedule(self) -> str:
        return self.schedule or ("interleaved" if self.vpp > 1 else "1f1b")

    @property
    def flash_attention(self) -> bool:
        return self.attention != "unfused"

    @property
    def sp(self) -> bool:
        return self.sequence_parallel and self.tp > 1

    def block(self, axis: str) -> int:
        """The consecutive ranks one group along `axis` spans (tp innermost, then cp, ep, dp; pp outermost)."""
        return {"tp": self.tp, "cp": self.tp * self.cp, "ep": self.tp * self.cp * self.ep,
                "dp": self.tp * self.cp * self.dp, "pp": self.gpus}[axis]

    def inside_node(self, axis: str) -> bool:
        return self.block(axis) <= self.gpus_per_node

    def span(self, axis: str) -> tuple[int, int]:
        """(members, members per node) of one group along `axis`: tp at stride 1, cp at stride tp, ep at stride
        tp·cp, dp — every replica of a weight, cp ranks included, as ZeRO shards over them — dp·cp at stride tp,
        edp (the experts' replicas) dp·cp/ep at stride tp·ep, pp at stride tp·cp·dp."""
        tp = self.tp
        cp = self.cp
        ep = self.ep
        dp = self.dp
        members, stride = {"tp": (tp, 1), "cp": (cp, tp), "ep": (ep, tp * cp), "dp": (dp * cp, tp),
                           "edp": (max(1, dp * cp // ep), tp * ep), "pp": (self.pp, tp * cp * dp)}[axis]
        if self.gpus <= self.gpus_per_node:          # one node holds every rank
            return members, members
        return members, members_per_node(members, stride, self.gpus_per_node)

    def check(self, model: ModelSpec) -> "Layout":
        """One-line ValueError naming the flag to change when this layout cannot run `model`; else self."""
        for name in ("tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive whole number, got {value!r}")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.attention not in ATTENTION:
            raise ValueError(f"--attention must be one of {', '.join(ATTENTION)}, got {self.attention!r}")
        if self.pipeline_schedule not in SCHEDULES:
            raise ValueError(f"--schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.vpp > 1 and self.pp == 1:
            raise ValueError(f"--vpp {self.vpp} interleaves chunks of a pipeline: give --pp 2 or more, or drop --vpp")
        if self.vpp > 1 and self.pipeline_schedule != "interleaved":
            raise ValueError(f"--vpp {self.vpp} interleaves chunks: it needs the interleaved schedule, not "
                             f"{self.pipeline_schedule}")
        if model.heads % self.tp:
            raise ValueError(f"--tp {self.tp} does not divide the {model.heads} heads; pick a divisor of --heads")
        # (two chunks may hold only the embedding and the head: Llama 3's 126 layers on 16 × 8 chunks)
        if self.pp * self.vpp > model.layers + 2:
            raise ValueError(f"--pp {self.pp} × --vpp {self.vpp} chunks need about as many layers, the model "
                             f"has {model.layers}; use fewer stages or chunks")
        if model.seq % (2 * self.cp if self.cp > 1 else 1):
            raise ValueError(f"--cp {self.cp} splits each sequence into 2·cp zig-zag pieces: --seq {model.seq} "
                             f"must be divisible by {2 * self.cp}")
        if self.sp and (model.seq // self.cp) % self.tp:
            raise ValueError(f"sequence parallelism splits this rank's {model.seq // self.cp} positions over --tp "
                             f"{self.tp}: pick tp dividing them")
        if self.ep > 1 and not model.experts:
            raise ValueError(f"--ep {self.ep} splits experts, and this model has none: give --experts, or drop --ep")
        if self.ep > 1 and (model.experts % self.ep or (self.dp * self.cp) % self.ep):
            raise ValueError(f"--ep {self.ep} must divide the {model.experts} experts and dp·cp = "
                             f"{self.dp * self.cp} (expert-parallel ranks are data-parallel ranks)")
        if self.batch % (self.dp * self.micro_batch):
            raise ValueError(f"--global-batch {self.batch} is not a multiple of dp × micro-batch = "
                             f"{self.dp} × {self.micro_batch}; every replica needs whole micro-batches")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ValueError(f"{self.gpus} GPUs (tp·pp·cp·dp) are not whole nodes of --gpus-per-node "
                             f"{self.gpus_per_node}")
        return self


def stage_layers(layers: int, stages: int) -> list[int]:
    """Layers per pipeline stage: ⌈l/p⌉ each, one fewer on the last, the first, the second-to-last, … stage until
    they add up to l (70 on 12: [5, 6, …, 6, 5]; 126 on 16: [7, 8, …, 8, 7])."""
    if not 1 <= stages <= layers:
        raise ValueError(f"a pipeline of {stages} stages needs 1 to {layers} of the model's layers")
    per = -(-layers // stages)
    counts, short = [per] * stages, per * stages - layers      # short < stages
    ends_first = [i for pair in zip(range(stages - 1, -1, -1), range(stages), strict=True) for i in pair]
    for i in ends_first[:short]:                               # distinct while short < stages
        counts[i] -= 1
    return counts
