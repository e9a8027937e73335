"""Problems of chapter 03 (the memory wall): model states per replica, activations, recomputation, accumulation.

Keys come from `theory.memory` (model_state_bytes, activation_bytes_per_layer, estimate_memory), the functions
notebook 03 takes the 120 GB apart with and measures on TinyGPT.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory, model_state_bytes

GB = 1e9
DEVICE = 80e9                          # an "80 GB" card, as notebook 03 compares: 80·10⁹ bytes
# (name, layers, hidden, heads): GPT-3's sizes (Brown et al. 2020, Table 2.1, 128-wide heads where h allows) and
# Megatron's 7.5B (Narayanan et al. 2021, Table 1), the notebook's example
SHAPES = [("0.35B", 24, 1024, 16), ("0.76B", 24, 1536, 16), ("1.3B", 24, 2048, 16), ("2.7B", 32, 2560, 32),
          ("6.7B", 32, 4096, 32), ("7.5B", 36, 4096, 32), ("13B", 40, 5120, 40)]
RECOMPUTE = {"none": "no recomputation", "selective": "selective recomputation (the attention core)",
             "full": "full recomputation (each layer's input only)"}
SETUPS = {("mixed", "adam"): "mixed precision (bf16 weights and gradients, an fp32 master copy) with Adam",
          ("mixed", "sgd"): "mixed precision (bf16 weights and gradients, an fp32 master copy) with SGD and momentum",
          ("fp32", "adam"): "fp32 with Adam"}


def _stack(shape: tuple, seq: int, micro_batch: int, recompute: str = "none", element_bytes: int = 2) -> int:
    """Bytes of activations all the model's layers keep for backward on one device."""
    _, layers, hidden, heads = shape
    return layers * activation_bytes_per_layer(seq=seq, micro_batch=micro_batch, hidden=hidden, heads=heads,
                                               recompute=recompute, element_bytes=element_bytes)


def _shape_text(shape: tuple) -> str:
    return f"A {shape[0]}-parameter GPT ({shape[1]} layers, hidden {shape[2]}, {shape[3]} heads)"


@problem("03.model-states", "Model states on one data-parallel replica", unit="GB", kind="one step",
         formula="(w + g + K)·Ψ bytes: mixed 2 + 2 + K (Adam K = 12: master 4, momentum 4, variance 4; SGD K = 8), "
                 "fp32 4 + 4 + K (Adam K = 8, SGD K = 4)",
         source="Rajbhandari et al. 2020 (ZeRO) §3.1; notebook 03, '120 GB for 7.5B parameters'")
def model_states(rng) -> Drawn:
    psi = int(rng.choice([1.3, 2.7, 6.7, 7.5, 13, 30, 65, 70, 175]) * 1e9)
    setup = rng.choice(sorted(SETUPS))
    precision, optimizer = setup
    weights, grads, opt = model_state_bytes(psi, precision=precision, optimizer=optimizer)
    key = (weights + grads + opt) / GB
    if setup == ("mixed", "adam"):
        third = (key + 4 * psi / GB, "the bf16 weights and gradients counted as fp32 (4 B each)")
    else:
        other = "sgd" if optimizer == "adam" else "adam"
        third = (sum(model_state_bytes(psi, precision=precision, optimizer=other)) / GB,
                 "Adam's two moments counted for SGD's one" if optimizer == "sgd"
                 else "one moment counted: Adam keeps two, the momentum and the variance")
    if precision == "mixed":
        master = (key - 4 * psi / GB, "the fp32 master copy forgotten: mixed precision keeps 4 B per parameter")
    else:
        master = (key + 4 * psi / GB, "an fp32 master copy added: fp32 weights are their own master")
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains in {SETUPS[setup]} under plain data parallelism. How "
                 "many GB of weights, gradients and optimizer states does each replica hold?", key,
                 given={"psi": psi, "precision": precision, "optimizer": optimizer},
                 mistakes=[((weights + grads) / GB, "the optimizer states forgotten"), master, third])


@problem("03.activations", "Activations a whole model keeps for backward", unit="GB", kind="one step",
         formula="l · sbh(34 + 5as/h) bytes: 16-bit activations, 1-byte dropout masks, no recomputation",
         source="Korthikanti et al. 2022 §4, Table 2; notebook 03, 'Activations: what the formula above leaves out'")
def activations(rng) -> Drawn:
    shape = rng.choice(SHAPES)
    seq = rng.choice([1024, 2048, 4096, 8192])
    b = rng.choice([1, 2, 4, 8])
    key = _stack(shape, seq, b) / GB
    return Drawn(f"{_shape_text(shape)} trains in bf16 at sequence length {seq}, micro-batch {b}, without "
                 "recomputation. How many GB of activations do its layers keep for backward?", key,
                 given={"layers": shape[1], "h": shape[2], "a": shape[3], "s": seq, "b": b},
                 mistakes=[(key / shape[1], "one layer's activations: every one of the l layers keeps its own"),
                           (_stack(shape, seq, b, "selective") / GB, "the attention scores 5as/h left out: "
                            "without recomputation they are kept"),
                           (_stack(shape, seq, b, element_bytes=4) / GB, "fp32 activations: bf16 keeps 2 bytes "
                            "per value")])


@problem("03.recompute-saving", "What a stronger recomputation policy saves", unit="GB", kind="judgement",
         formula="per layer: none sbh(34 + 5as/h), selective 34sbh, full 2sbh; saved = l × the difference",
         source="Korthikanti et al. 2022 §4–5, Table 2; notebook 03, '2 · Activation checkpointing (激活重计算)'")
def recompute_saving(rng) -> Drawn:
    shape = rng.choice(SHAPES)
    seq = rng.choice([2048, 4096, 8192])
    b = rng.choice([1, 2, 4])
    weak, strong = rng.choice([("none", "selective"), ("selective", "full"), ("none", "full")])
    key = (_stack(shape, seq, b, weak) - _stack(shape, seq, b, strong)) / GB
    fp32 = (_stack(shape, seq, b, weak, 4) - _stack(shape, seq, b, strong, 4)) / GB
    return Drawn(f"{_shape_text(shape)} trains in bf16 at sequence length {seq}, micro-batch {b}. How many GB of "
                 f"activations does {RECOMPUTE[strong]} keep less than {RECOMPUTE[weak]}?", key,
                 given={"layers": shape[1], "h": shape[2], "a": shape[3], "s": seq, "b": b, "weak": weak,
                        "strong": strong},
                 mistakes=[(key / shape[1], "one layer's saving: every one of the l layers saves it"),
                           (fp32, "fp32 activations: bf16 keeps 2 bytes per value (masks 1)"),
                           (_stack(shape, seq, b, strong) / GB, f"the bytes {strong} recomputation "
                            "keeps, not what it saves")])


@problem("03.accumulation-saving", "What gradient accumulation saves in activations", unit="GB", kind="judgement",
         formula="activations scale with the micro-batch: B at once keeps l·A(B), m micro-batches l·A(B/m); "
                 "saved (1 − 1/m)·l·A(B)",
         source="Korthikanti et al. 2022 Table 2; notebook 03, '3 · Gradient accumulation (梯度累积)'")
def accumulation_saving(rng) -> Drawn:
    shape = rng.choice(SHAPES[:5])
    seq = rng.choice([1024, 2048, 4096])
    batch = rng.choice([8, 16, 32, 64])
    m = rng.choice([4, 8])
    recompute = rng.choice(["selective", "full"])
    whole = _stack(shape, seq, batch, recompute) / GB
    key = whole - _stack(shape, seq, batch // m, recompute) / GB
    return Drawn(f"{_shape_text(shape)} trains in bf16 at sequence length {seq} with {RECOMPUTE[recompute]}, "
                 f"{batch} sequences per GPU per step. How many GB of activations alive at once does splitting "
                 f"them into {m} accumulated micro-batches save against one pass over all {batch}?", key,
                 given={"layers": shape[1], "h": shape[2], "a": shape[3], "s": seq, "B": batch, "m": m,
                        "recompute": recompute},
                 mistakes=[(whole, "all of it saved: one micro-batch's activations are still alive"),
                           (whole - key, "the bytes one micro-batch keeps, not the saving"),
                           (key / shape[1], "one layer's saving: every one of the l layers saves it")])


def _fewest(psi: int, shape: tuple, seq: int, batch: int, recompute: str, counted=lambda est: est.total_bytes,
            budget: float = DEVICE, precision: str = "mixed") -> int:
    """The smallest m dividing `batch` whose micro-batch batch/m fits `budget` bytes by `counted`; 0 if none."""
    _, layers, hidden, heads = shape
    for m in (d for d in range(1, batch + 1) if batch % d == 0):
        est = estimate_memory(psi, layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=batch // m,
                              recompute=recompute, precision=precision)
        if counted(est) <= budget:
            return m
    return 0


@problem("03.accumulation-steps", "The fewest accumulation steps that fit one GPU", unit="micro-batches",
         kind="several steps",
         formula="smallest m dividing B with 16Ψ + l·A(B/m) ≤ 80·10⁹ B (mixed precision + Adam: 16 B per "
                 "parameter; A per layer from Korthikanti et al. Table 2)",
         source="Rajbhandari et al. 2020 §3.1; Korthikanti et al. 2022 Table 2; notebook 03, 'Squeeze one device "
                "first'")
def accumulation_steps(rng) -> Drawn:
    key = 0
    while key < 2:                      # m = 1 needs no accumulation; 0: even one sequence does not fit
        shape = rng.choice(SHAPES[:4])
        psi = int(float(shape[0][:-1]) * 1e9)
        seq = rng.choice([1024, 2048, 4096, 8192])
        batch = rng.choice([16, 32, 64, 128])
        recompute = rng.choice(["none", "selective", "full"])
        key = _fewest(psi, shape, seq, batch, recompute)
    slips = [(_fewest(psi, shape, seq, batch, recompute, lambda est: est.activations_bytes),
              "the model states forgotten: 16 B per parameter sit beside the activations"),
             (_fewest(psi, shape, seq, batch, recompute, lambda est: est.total_bytes - est.optimizer_bytes),
              "the optimizer states forgotten: the master copy and Adam's moments are 12 B per parameter"),
             (_fewest(psi, shape, seq, batch, recompute, budget=80 * 2**30), "80 GB read as 80 GiB"),
             (_fewest(psi, shape, seq, batch, recompute,
                      lambda est: est.total_bytes - est.activations_bytes * (shape[1] - 1) // shape[1]),
              "one layer's activations: every one of the l layers keeps its own"),
             (_fewest(psi, shape, seq, batch, recompute, precision="fp32"),
              "fp32 activations: bf16 keeps 2 bytes per value")]
    return Drawn(f"{_shape_text(shape)} trains in mixed precision with AdamW on one "
                 f"80 GB GPU (80·10⁹ B) at sequence length {seq} with {RECOMPUTE[recompute]}, {batch} sequences "
                 "per step. Into how many equal micro-batches, at the fewest, must gradient accumulation split the "
                 "step to fit?", key,
                 given={"psi": psi, "layers": shape[1], "h": shape[2], "a": shape[3], "s": seq, "B": batch,
                        "recompute": recompute},
                 mistakes=[(m, why) for m, why in slips if m > 0])
