"""Bytes per device: parameters, gradients, optimizer states and activations.

    partrain-edu memory --params 7.5e9 --json               # 15 + 15 + 90 = 120 GB on one device
    partrain-edu memory --params 7.5e9 --dp 64 --zero 3     # 1.875 GB per device

**Model states** (Rajbhandari et al. 2020, "ZeRO", §3.1 and §5, Figure 1). With Ψ parameters, 16-bit
weights and gradients and K bytes of optimizer state per parameter, each of N_d data-parallel devices holds

    stage 0 (DDP)           2Ψ    + 2Ψ    + KΨ          (Figure 1, "baseline")
    stage 1 (P_os)          2Ψ    + 2Ψ    + KΨ/N_d
    stage 2 (P_os+g)        2Ψ    + 2Ψ/N_d + KΨ/N_d
    stage 3 (P_os+g+p)      2Ψ/N_d + 2Ψ/N_d + KΨ/N_d

Mixed precision + Adam gives K = 12: an fp32 master copy of the weights (4 B) and Adam's two moments
(4 + 4 B), so 7.5B parameters take 15 + 15 + 90 = 120 GB, and 31.4 / 16.6 / 1.9 GB per device for stages
1 / 2 / 3 at N_d = 64. Our byte counts per parameter (weights, gradients, optimizer):

    precision  optimizer   bytes      optimizer state
    mixed      adam        2, 2, 12   fp32 master 4 + momentum 4 + variance 4   (ZeRO's K = 12)
    mixed      sgd         2, 2, 8    fp32 master 4 + momentum 4   (mixed precision always keeps the master)
    fp32       adam        4, 4, 8    momentum 4 + variance 4      (the weights are their own master)
    fp32       sgd         4, 4, 4    momentum 4

Tensor and pipeline parallelism split the model before ZeRO sees it. We use the simple, even rule: each of
the tp·pp model-parallel ranks holds Ψ/(tp·pp) parameters (Megatron shards every weight matrix over tp and
gives each pipeline stage l/pp layers; we ignore that layernorms are replicated and the embedding sits on
the first and last stage). ZeRO then shards that over dp. Shards are padded to whole elements,
⌈Ψ/n⌉, as DeepSpeed and FSDP pad their flat buffers, so the bytes × N_d can exceed the unsharded bytes by
less than one element per device.

**Parameter count** of a GPT with tied input/output embedding and learned positions (GPT-2, Megatron-LM),
l layers, hidden size h, vocabulary V, sequence length s: per layer 12h² + 13h (QKV 3h² + 3h, projection
h² + h, MLP 8h² + 5h, two layernorms 4h), plus the embeddings (V + s)h, plus the final layernorm 2h:

    P = 12lh² + 13lh + (V + s)h + 2h

Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §5.1) write the same without the final layernorm, P = 12lh²(1 + 13/(12h) + (V + s)/(12lh)),
and list the rounded counts in their Table 1 (1.7B for l = 24, h = 2304; 1008B for l = 128, h = 25600).

**Activations** (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
§4, Table 2). Per transformer layer, sequence s, micro-batch b, hidden h, a heads, tensor-parallel t:

    no parallelism                         sbh(34 + 5as/h)
    tensor parallel                        sbh(10 + 24/t + 5as/(ht))
    tensor + sequence parallel             sbh(34/t + 5as/(ht))
    tensor parallel + selective recompute  sbh(10 + 24/t)
    tensor + sequence + selective          sbh(34/t)
    full recompute                         2sbh              (the layer input only; /t with sequence parallel)
    context parallel c (any row above)     every term over the rank's s/c queries: sbh → sbh/c, as²b → as²b/c

These count 16-bit activations and 1-byte dropout masks. We keep the paper's pieces apart so fp32 works too:
with e bytes per activation element, 2sbh + as²b mask bytes and (16e)sbh + (2e)as²b value bytes, of which
(4e + 2)sbh are not split by tensor parallelism (layernorms, the inputs of the QKV and first MLP matmuls,
two dropout masks); e = 2 gives exactly the table. Under pipeline parallelism each stage holds l/pp layers
for every micro-batch in flight; the first stage has the most in flight: min(pp, m) under 1F1B, m under
GPipe (Narayanan et al. 2021 §2.2; the 1F1B first stage therefore holds l layers' worth, pp × l/pp).
Context parallelism (ring attention, Liu et al. 2023) shards the sequence: each of c ranks keeps the activations of
its s/c positions, and its attention scores cover its s/c queries against all s keys, so a layer's bytes fall c-fold.
"""

from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.units import format_bytes, format_count, parse_size

PRECISIONS = ("mixed", "fp32")
OPTIMIZERS = ("adam", "sgd")
RECOMPUTE = ("none", "selective", "full")
# (weight bytes, gradient bytes, optimizer bytes) per parameter, see the table in the module docstring.
BYTES_PER_PARAM = {
    ("mixed", "adam"): (2, 2, 12),
    ("mixed", "sgd"): (2, 2, 8),
    ("fp32", "adam"): (4, 4, 8),
    ("fp32", "sgd"): (4, 4, 4),
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one device. ``params`` is the whole model's parameter count Ψ (not per device)."""

    params: int
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes

    def to_dict(self) -> dict:
        """The ``memory --json`` object."""
        return {"params": self.params, "bytes": {
            "params": self.params_bytes, "grads": self.grads_bytes, "optimizer": self.optimizer_bytes,
            "activations": self.activations_bytes, "total": self.total_bytes}}

    def table(self) -> str:
        rows = [("params", self.params_bytes), ("grads", self.grads_bytes),
                ("optimizer", self.optimizer_bytes), ("activations", self.activations_bytes),
                ("total", self.total_bytes)]
        lines = [f"model: {format_count(self.params)} parameters; bytes per device:"]
        lines += [f"  {name:<12}{format_bytes(value):>12}   ({value:,} B)" for name, value in rows]
        return "\n".join(lines)


def _positive(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive whole number, got {value!r}")
    return value


def _divides(small_name: str, small: int, big_name: str, big: int) -> None:
    if big % small:
        raise ValueError(f"{big_name} {big} is not divisible by {small_name} {small}; "
                         f"pick {small_name} that divides {big_name}")


def gpt_param_count(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """P = 12lh² + 13lh + (V + s)h + 2h for a GPT with tied embedding and learned positions (see above)."""
    for name, value in (("--layers", layers), ("--hidden", hidden), ("--vocab", vocab), ("--seq", seq)):
        _positive(name, value)
    return 12 * layers * hidden**2 + 13 * layers * hidden + (vocab + seq) * hidden + 2 * hidden


def model_state_bytes(params: int, *, dp: int = 1, zero: int = 0, precision: str = "mixed",
                      optimizer: str = "adam") -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per device for ``params`` parameters under ZeRO ``zero`` over ``dp``.

    The ZeRO paper's §5 formulas; a shard of n parameters over dp devices is ⌈n/dp⌉ parameters (padding).
    """
    _positive("--params", params)
    _positive("--dp", dp)
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"--zero must be 0, 1, 2 or 3, got {zero!r}")
    if (precision, optimizer) not in BYTES_PER_PARAM:
        raise ValueError(f"--precision must be one of {PRECISIONS} and --optimizer one of {OPTIMIZERS}, "
                         f"got {precision!r} and {optimizer!r}")
    weight_b, grad_b, opt_b = BYTES_PER_PARAM[precision, optimizer]
    shard = -(-params // dp)  # ⌈Ψ/N_d⌉
    return (weight_b * (shard if zero >= 3 else params),
            grad_b * (shard if zero >= 2 else params),
            opt_b * (shard if zero >= 1 else params))


def activation_bytes_per_layer(*, seq: int, micro_batch: int, hidden: int, heads: int, tp: int = 1,
                               sequence_parallel: bool = False, recompute: str = "none",
                               element_bytes: int = 2, cp: int = 1) -> int:
    """Bytes one transformer layer keeps for backward on one device (Korthikanti et al. 2022, Table 2).

    ``element_bytes`` = 2 reproduces the paper; 4 is fp32 training (dropout masks stay 1 byte).
    """
    for name, value in (("--seq", seq), ("--micro-batch", micro_batch), ("--hidden", hidden),
                        ("--heads", heads), ("--tp", tp), ("--cp", cp)):
        _positive(name, value)
    if recompute not in RECOMPUTE:
        raise ValueError(f"--recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    _divides("--heads", heads, "--hidden", hidden)
    _divides("--tp", tp, "--heads", heads)
    _divides("--cp", cp, "--seq", seq)
    if sequence_parallel:
        _divides("--tp", tp, "--seq", seq // cp)
    sbh, e = seq // cp * micro_batch * hidden, element_bytes   # this rank's s/c positions
    sp = tp if sequence_parallel else 1
    if recompute == "full":  # only the layer's input is stored; it is sequence-sharded under SP
        return e * sbh // sp
    replicated = (4 * e + 2) * sbh // sp   # layernorms, QKV/MLP inputs, 2 dropout masks: 10sbh at e = 2
    split = 12 * e * sbh // tp             # the rest of the 34sbh: 24sbh/t at e = 2
    # the attention core: this rank's s/c queries against all s keys
    attention = 0 if recompute == "selective" else (2 * e + 1) * heads * (seq // cp) * seq * micro_batch // tp
    return replicated + split + attention  # selective recompute drops the 5as²b/t attention core


def estimate_memory(params: int | float | str | None = None, *, dp: int = 1, tp: int = 1, pp: int = 1, zero: int = 0,
                    precision: str = "mixed", optimizer: str = "adam", layers: int | None = None,
                    hidden: int | None = None, heads: int | None = None, seq: int | None = None,
                    micro_batch: int | None = None, vocab: int | None = None, recompute: str = "none",
                    sequence_parallel: bool = False, schedule: str = "1f1b",
                    microbatches: int | None = None, cp: int = 1) -> MemoryEstimate:
    """Bytes per device of a training run; the ``memory`` subcommand.

    Give ``params``, or the architecture (``layers``, ``hidden``, ``vocab``, ``seq``) to count them with
    :func:`gpt_param_count`. Activations need ``layers``, ``hidden``, ``heads``, ``seq`` and
    ``micro_batch``; they are 0 when ``micro_batch`` is not given. ``schedule`` ("1f1b" or "gpipe") and
    ``microbatches`` say how many micro-batches the first pipeline stage holds (min(pp, m) or m). ``cp`` shards
    the activations by sequence (the model states stay whole on each of the cp ranks).
    """
    for name, value in (("--dp", dp), ("--tp", tp), ("--pp", pp)):
        _positive(name, value)
    if params is None:
        missing = [flag for flag, v in (("--layers", layers), ("--hidden", hidden), ("--vocab", vocab),
                                        ("--seq", seq)) if v is None]
        if missing:
            raise ValueError("give --params, or --layers, --hidden, --vocab and --seq to count them "
                             f"(missing {' '.join(missing)})")
        params = gpt_param_count(layers, hidden, vocab, seq)
    if isinstance(params, (str, float)):  # notebooks may say 7.5e9 or "7.5B"
        params = parse_size(params)
    _positive("--params", params)
    if layers is not None:
        _divides("--pp", pp, "--layers", _positive("--layers", layers))
    # Tensor and pipeline parallelism split the model evenly; ZeRO shards each split over dp.
    model_parallel_shard = -(-params // (tp * pp))
    weights, grads, opt = model_state_bytes(model_parallel_shard, dp=dp, zero=zero, precision=precision,
                                            optimizer=optimizer)
    activations = 0
    if micro_batch is not None:
        missing = [flag for flag, v in (("--layers", layers), ("--hidden", hidden), ("--heads", heads),
                                        ("--seq", seq)) if v is None]
        if missing:
            raise ValueError("activations need --layers, --hidden, --heads, --seq and --micro-batch "
                             f"(missing {' '.join(missing)})")
        if schedule not in ("1f1b", "gpipe"):
            raise ValueError(f"schedule must be '1f1b' or 'gpipe' for memory, got {schedule!r}")
        if schedule == "gpipe" and microbatches is None:
            raise ValueError("a GPipe estimate needs --microbatches (GPipe holds all m in flight)")
        if microbatches is not None:
            _positive("--microbatches", microbatches)
        in_flight = microbatches if schedule == "gpipe" else min(pp, microbatches or pp)
        per_layer = activation_bytes_per_layer(
            seq=seq, micro_batch=micro_batch, hidden=hidden, heads=heads, tp=tp,
            sequence_parallel=sequence_parallel, recompute=recompute,
            element_bytes=2 if precision == "mixed" else 4, cp=cp)
        activations = per_layer * (layers // pp) * in_flight
    return MemoryEstimate(params=params, params_bytes=weights, grads_bytes=grads, optimizer_bytes=opt,
                          activations_bytes=activations)
