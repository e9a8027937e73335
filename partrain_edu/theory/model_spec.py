"""A transformer's shape, and what follows from it: parameters, active parameters, FLOPs per token.

    spec = MODELS["llama3-405b"]; spec.params(); spec.flops_per_token("none")   # 405.9B; 2.6e12 per token

One dataclass for every model the course prices (memory, traffic, step time, the planner, the emulated device).
A layer is attention (Q and O of h×h, K and V of h×kv·d: grouped-query attention, Ainslie et al. 2023, when kv <
heads) and an MLP of width f, gated (SwiGLU, Shazeer 2020: three h×f matrices) or not (two); a mixture-of-experts
layer replaces the MLP by E experts of width f_e of which each token visits k (Fedus et al. 2022), plus a router
(h×E). **FLOPs per token** of a step (Narayanan et al. 2021, §5.1; 2 FLOPs per multiply-add, backward twice the
forward): 6 × the weights a token multiplies (the active parameters in matrices, the logits' h×V included) plus
attention's QKᵀ and A·V, 12·l·s·h over the full s×s as the paper counts it. For a GPT (f = 4h, kv = heads) that
is 72lh² + 12lsh + 6hV. Recompute adds a forward: "full" every layer's, "selective" the attention core's, counted
as Korthikanti et al. 2022 App. A count it in their HFU (s/3h instead of s/6h: 12·l·s·h more per token),
"selective-op" half the matrices' (PyTorch's per-operator selective checkpointing as torchtitan uses it: every
other matmul's output is saved, the rest and the elementwise work are recomputed). Pure Python.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

RECOMPUTE = ("none", "selective", "selective-op", "full")


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int
    kv_heads: int = 0                  # 0: as many as heads (multi-head attention); 1: multi-query
    ffn: int = 0                       # the MLP's width; 0: 4·hidden
    gated: bool = False                # SwiGLU / GeGLU: three matrices instead of two
    tied_embeddings: bool = True       # the logits reuse the input embedding (GPT-2, Megatron, BLOOM)
    learned_positions: bool = True     # a (seq × h) position table (GPT-2); False: rotary or ALiBi, no parameters
    bias: bool = True                  # biases and LayerNorm (GPT); False: none and RMSNorm (Llama)
    dropout: bool = True               # dropout layers (and their 1-byte masks kept for backward); False: p = 0
    experts: int = 0                   # 0: dense; else experts per MoE layer
    top_k: int = 1
    moe_ffn: int = 0                   # one expert's width; 0: ffn
    moe_layers: int = 0                # how many layers are MoE (the rest dense); 0 with experts: all of them
    shared_experts: int = 0            # experts every token visits (DeepSeek-MoE)
    source: str = field(default="", compare=False)

    def __post_init__(self):
        for name in ("layers", "hidden", "heads", "vocab", "seq"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"--{name} must be a positive whole number, got {value!r}")
        for name in ("kv_heads", "ffn", "experts", "moe_ffn", "moe_layers", "shared_experts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a whole number ≥ 0, got {value!r}")
        if self.hidden % self.heads:
            raise ValueError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}; "
                             "pick heads that divide it")
        if self.heads % self.kv:
            raise ValueError(f"--heads {self.heads} is not divisible by --kv-heads {self.kv}: each KV head serves "
                             "a whole group of query heads")
        if self.experts and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"--top-k must be between 1 and --experts {self.experts}, got {self.top_k}")
        if self.moe_layers > self.layers:
            raise ValueError(f"--moe-layers {self.moe_layers} exceeds --layers {self.layers}")

    # ---- the derived widths
    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv * self.head_dim

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def expert_width(self) -> int:
        return self.moe_ffn or self.ffn_width

    @property
    def n_moe(self) -> int:
        """How many layers are MoE."""
        return (self.moe_layers or self.layers) if self.experts else 0

    # ---- parameters
    def attention_params(self) -> int:
        h, kv = self.hidden, self.kv_dim
        return 2 * h * h + 2 * h * kv + (2 * h + 2 * kv if self.bias else 0)

    def mlp_params(self, width: int | None = None) -> int:
        h = self.hidden
        f = width or self.ffn_width
        mats = 3 if self.gated else 2
        return mats * h * f + ((mats - 1) * f + h if self.bias else 0)

    def norm_params(self) -> int:
        return (2 if self.bias else 1) * self.hidden   # LayerNorm's weight and bias, or RMSNorm's weight

    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    def moe_layer_params(self, active: bool = False) -> int:
        experts = (self.top_k if active else self.experts) + self.shared_experts
        return (self.attention_params() + experts * self.mlp_params(self.expert_width)
                + self.hidden * self.experts + 2 * self.norm_params())    # + the router

    def embedding_params(self) -> int:
        """The input embedding (and learned positions); the output head when untied is `head_params`."""
        return self.vocab * self.hidden + (self.seq * self.hidden if self.learned_positions else 0)

    def head_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def params(self) -> int:
        """Every parameter: for a GPT, 12lh² + 13lh + (V + s)h + 2h (`memory.gpt_param_count`)."""
        layers = (self.layers - self.n_moe) * self.dense_layer_params() + self.n_moe * self.moe_layer_params()
        return layers + self.embedding_params() + self.head_params() + self.norm_params()

    def active_params(self) -> int:
        """The parameters one token uses: the k experts it visits instead of all E."""
        layers = ((self.layers - self.n_moe) * self.dense_layer_params()
                  + self.n_moe * self.moe_layer_params(active=True))
        return layers + self.embedding_params() + self.head_params() + self.norm_params()

    # ---- FLOPs
    def layer_matmul_weights(self, moe: bool = False) -> int:
        """The weights one token multiplies in one layer (no biases, no norms: they cost no matmul)."""
        h, kv = self.hidden, self.kv_dim
        mats = 3 if self.gated else 2
        if moe:
            mlp = (self.top_k + self.shared_experts) * mats * h * self.expert_width + h * self.experts
        else:
            mlp = mats * h * self.ffn_width
        return 2 * h * h + 2 * h * kv + mlp

    def attention_core_flops(self) -> int:
        """One token's forward QKᵀ and A·V over the full s×s (Narayanan et al. 2021 count no causal saving)."""
        return 4 * self.seq * self.hidden

    def forward_flops_per_token(self) -> dict[str, int]:
        """One forward, per token: {"dense", "moe", "attention", "logits"} (all layers together)."""
        return {"dense": 2 * (self.layers - self.n_moe) * self.layer_matmul_weights(),
                "moe": 2 * self.n_moe * self.layer_matmul_weights(moe=True),
                "attention": self.layers * self.attention_core_flops(),
                "logits": 2 * self.hidden * self.vocab}

    def flops_per_token(self, recompute: str = "none") -> float:
        """A training step's FLOPs per token: 3 × the forward, + the recomputed part (see the docstring)."""
        if recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
        f = self.forward_flops_per_token()
        layers = f["dense"] + f["moe"] + f["attention"]
        extra = {"none": 0, "full": layers, "selective": 3 * f["attention"],
                 "selective-op": (f["dense"] + f["moe"]) / 2}[recompute]
        return 3 * (layers + f["logits"]) + extra

    def with_seq(self, seq: int) -> "ModelSpec":
        return replace(self, seq=seq)


def gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 51200, seq: int = 2048,
        source: str = "") -> ModelSpec:
    """A GPT-2/GPT-3/Megatron shape: MLP 4h, biases and LayerNorm, tied embedding, learned positions."""
    return ModelSpec(name, layers, hidden, heads, vocab, seq, source=source)


def llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, seq: int,
          source: str = "") -> ModelSpec:
    """A Llama shape: SwiGLU, RMSNorm, no biases, rotary positions, untied head, grouped-query attention."""
    return ModelSpec(name, layers, hidden, heads, vocab, seq, kv_heads=kv_heads, ffn=ffn, gated=True,
                     tied_embeddings=False, learned_positions=False, bias=False, dropout=False, source=source)


MODELS = {
    # the course's example: GPT-3 XL (Brown et al. 2020, Table 2.1), GPT-2's vocabulary
    "gpt-1.3b": gpt("GPT-3 XL (1.3B)", 24, 2048, 16, vocab=50257, source="Brown et al. 2020, Table 2.1"),
    "gpt3-175b": gpt("GPT-3 175B", 96, 12288, 96, source="Brown et al. 2020, Table 2.1 (Megatron's vocab 51200)"),
    "megatron-1t": gpt("Megatron 1T", 128, 25600, 160, source="Narayanan et al. 2021, Table 1"),
    "bloom-176b": ModelSpec("BLOOM 176B", 70, 14336, 112, 250880, 2048, learned_positions=False,
                            source="BigScience 2022, tr11-176B-ml README (ALiBi: no position table)"),
    "llama3-8b": llama("Llama 3 8B", 32, 4096, 32, 8, 14336, 128256, 8192, source="Dubey et al. 2024, Table 3"),
    "llama3-70b": llama("Llama 3 70B", 80, 8192, 64, 8, 28672, 128256, 8192, source="Dubey et al. 2024, Table 3"),
    "llama3-405b": llama("Llama 3 405B", 126, 16384, 128, 8, 53248, 128256, 8192,
                         source="Dubey et al. 2024, Table 3"),
    # Mixtral 8x7B (Jiang et al. 2024, Table 1): Mistral 7B's shape with 8 experts of which 2 per token
    "mixtral-8x7b": ModelSpec("Mixtral 8x7B", 32, 4096, 32, 32000, 4096, kv_heads=8, ffn=14336, gated=True,
                              tied_embeddings=False, learned_positions=False, bias=False, dropout=False,
                              experts=8, top_k=2,
                              source="Jiang et al. 2024, Table 1"),
}


def model_named(name: str) -> ModelSpec:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}: use one of {', '.join(MODELS)}, or give the shape "
                         "(--layers --hidden --heads --vocab --seq)")
    return MODELS[name]
