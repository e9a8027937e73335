"""Problems of chapter 12 (mixed precision): what bf16 halves on the wire, and the bytes it holds and saves.

Keys come from `theory.traffic` (step_traffic, ring_bytes_sent: the bytes with 2- or 4-byte elements) and
`theory.memory` (model_state_bytes for the 2 + 2 + 12 and 2 + 4 + 12 counts, estimate_memory for the activations
held in 16 against 32 bits), the functions notebook 12 checks its measured bytes against.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory, gpt_param_count, model_state_bytes
from partrain_edu.theory.traffic import ring_bytes_sent, step_traffic

SIZES_B = [1.3, 2.7, 6.7, 8, 13, 20, 34, 70]     # billions of parameters


def _sent(strategy: str, psi: int, dp: int, element: int, op: str = "", microbatches: int = 1) -> int:
    """Bytes one rank sends per step under `strategy`, only the `op` collectives when given."""
    calls = step_traffic(strategy, psi, dp=dp, microbatches=microbatches, bytes_per_element=element).collectives
    return sum(c.bytes_sent for c in calls if not op or c.op == op)


@problem("12.grad-reduce-bf16", "What reducing the gradients in bf16 saves on the wire", unit="GB",
         kind="one step",
         formula="saved = 2(n−1)/n · Ψ · (4 − 2) B: the same ring all-reduce, 2-byte instead of 4-byte elements",
         source="Micikevicius et al. 2018 §3; Megatron-LM --grad-reduce-in-bf16; notebook 12, 'Reducing gradients "
                "in bf16: half the bytes, one rounding per hop'")
def grad_reduce_bf16(rng) -> Drawn:
    psi = int(rng.choice(SIZES_B) * 1e9)
    n = rng.choice([4, 8, 16, 32, 64])
    fp32 = _sent("ddp", psi, n, 4)
    key = (fp32 - _sent("ddp", psi, n, 2)) / 1e9
    half = (ring_bytes_sent("reduce_scatter", 4 * psi, n) - ring_bytes_sent("reduce_scatter", 2 * psi, n)) / 1e9
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains with bf16 compute under DDP on {n} GPUs; Megatron-LM "
                 "all-reduces its gradients in fp32 (ring), --grad-reduce-in-bf16 in bf16. How many GB less does "
                 "one rank send per step with --grad-reduce-in-bf16?", key, given={"psi": psi, "n": n},
                 mistakes=[(2 * (4 - 2) * psi / 1e9, "the (n−1)/n factor dropped: each rank sends 2(n−1) chunks "
                            "of S/n"),
                           (half, "only the reduce-scatter half counted: the all-gather half shrinks as well"),
                           (fp32 / 1e9, "the fp32 all-reduce's bytes, not the difference")])


@problem("12.fsdp-policy-bytes", "FSDP with bf16 parameters and fp32 gradient reduction", unit="GB",
         kind="several steps",
         formula="sent = m · [2 · (n−1)/n · 2Ψ (bf16 all-gathers, forward and backward) + (n−1)/n · 4Ψ (fp32 "
                 "reduce-scatter)]",
         source="Rajbhandari et al. 2020 §7.2.2; torchtitan mixed_precision_reduce = 'float32'; notebook 12, "
                "'Half the bytes on the wire'")
def fsdp_policy_bytes(rng) -> Drawn:
    psi = int(rng.choice(SIZES_B) * 1e9)
    n = rng.choice([8, 16, 32, 64, 128])
    m = rng.choice([2, 4, 8])
    gathers = _sent("zero3", psi, n, 2, "all_gather", m)
    scatters = _sent("zero3", psi, n, 4, "reduce_scatter", m)
    key = (gathers + scatters) / 1e9
    swapped = _sent("zero3", psi, n, 4, "all_gather", m) + _sent("zero3", psi, n, 2, "reduce_scatter", m)
    return Drawn(f"A {psi / 1e9:g}B-parameter model runs under FSDP (ZeRO-3) on {n} GPUs with "
                 "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), torchtitan's default, and "
                 f"{m} micro-batches per step. How many GB does one rank send per step (ring model)?", key,
                 given={"psi": psi, "n": n, "m": m},
                 mistakes=[(_sent("zero3", psi, n, 2, microbatches=m) / 1e9, "everything in bf16: reduce_dtype="
                            "fp32 sends the gradients in 4 bytes"),
                           (_sent("zero3", psi, n, 4, microbatches=m) / 1e9, "everything in fp32: param_dtype=bf16 "
                            "halves the all-gathers"),
                           (swapped / 1e9, "the dtypes swapped: param_dtype sets the all-gathers', reduce_dtype "
                            "the reduce-scatter's"),
                           ((gathers + scatters) / m / 1e9, "one micro-batch only: each micro-batch gathers and "
                            "reduce-scatters again")])


@problem("12.distopt-states", "Model states with an fp32 gradient buffer under ZeRO-1", unit="GB",
         kind="several steps",
         formula="per GPU = 2Ψ (bf16 weights) + 4Ψ (fp32 gradient buffer) + 12Ψ/N_d (fp32 master, m, v sharded)",
         source="Rajbhandari et al. 2020 §3.1, §5; Megatron-Core distributed optimizer ('float16 param, fp32 "
                "grads'); notebook 12, 'Bytes per parameter, read from the tensors'")
def distopt_states(rng) -> Drawn:
    psi = int(rng.choice(SIZES_B) * 1e9)
    nd = rng.choice([4, 8, 16, 32])
    zero1 = model_state_bytes(psi, dp=nd, zero=1, precision="mixed")
    weights = zero1[0]
    states = zero1[2]
    fp32_grads = model_state_bytes(psi, dp=nd, zero=1, precision="fp32")[1]
    key = (weights + fp32_grads + states) / 1e9
    unsharded = model_state_bytes(psi, precision="mixed")[2]
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains in bf16 mixed precision with AdamW on {nd} data-parallel "
                 "GPUs, Megatron-Core style: an fp32 gradient buffer (not a bf16 one), and the optimizer states "
                 "sharded as in ZeRO-1. How many GB of model states does each GPU hold?", key,
                 given={"psi": psi, "nd": nd},
                 mistakes=[(sum(zero1) / 1e9,
                            "ZeRO's 2-byte gradients: this buffer is fp32, 4 bytes"),
                           ((weights + fp32_grads + unsharded) / 1e9, "the optimizer states not sharded: ZeRO-1 "
                            "splits master, m and v over the N_d GPUs"),
                           ((weights + fp32_grads + model_state_bytes(psi, dp=nd, zero=1, precision="fp32")[2]) / 1e9,
                            "the fp32 master weights left out of the optimizer state (K = 8, as in fp32 training)"),
                           ((weights + model_state_bytes(psi, dp=nd, zero=2, precision="fp32")[1] + states) / 1e9,
                            "the gradient buffer sharded too: that is ZeRO-2, not ZeRO-1")])


@problem("12.activation-saving", "What bf16 saves per GPU against fp32 training", unit="GB", kind="judgement",
         formula="model states 2 + 2 + 12 = 4 + 4 + 8 B per parameter; activations per layer (16e + 2)·sbh + "
                 "(2e + 1)·a·s²·b with e = 2 against e = 4: saved = l · (32·sbh + 4·a·s²·b)",
         source="Micikevicius et al. 2018 §3; Korthikanti et al. 2022 §4, Table 2; notebook 12, 'Bytes per "
                "parameter, read from the tensors'")
def activation_saving(rng) -> Drawn:
    layers, hidden = rng.choice([(24, 2048), (32, 4096), (40, 5120), (48, 6144)])
    heads = hidden // 128
    seq = rng.choice([1024, 2048, 4096])
    b = rng.choice([1, 2, 4])
    psi = gpt_param_count(layers, hidden, 50257, seq)
    shape = dict(layers=layers, hidden=hidden, heads=heads, seq=seq, micro_batch=b)
    mixed = estimate_memory(psi, precision="mixed", **shape)
    fp32 = estimate_memory(psi, precision="fp32", **shape)
    key = (fp32.total_bytes - mixed.total_bytes) / 1e9
    per_layer = dict(seq=seq, micro_batch=b, hidden=hidden, heads=heads)
    no_scores = layers * (activation_bytes_per_layer(**per_layer, recompute="selective", element_bytes=4)
                          - activation_bytes_per_layer(**per_layer, recompute="selective", element_bytes=2))
    return Drawn(
        f"A {psi / 1e9:.1f}B-parameter GPT (l = {layers}, h = {hidden}, a = {heads} heads) trains with AdamW under DDP "
        f"at s = {seq}, micro-batch {b}, no recompute. Option A: fp32 throughout; option B: bf16 mixed precision "
        "(fp32 master weights and moments). How many GB per GPU does B save against A?",
        key, given={"psi": psi, "l": layers, "h": hidden, "a": heads, "s": seq, "b": b},
        mistakes=[(key + sum(model_state_bytes(psi, precision="fp32")) / 2 / 1e9, "the model states taken to "
                   "halve: 2 + 2 + 12 is as much as fp32's 4 + 4 + 8"),
                  (key / layers, "one layer's activations only: each of the l layers keeps its own"),
                  (no_scores / 1e9, "the s×s attention scores and masks (a·s²·b terms) left out"),
                  (mixed.activations_bytes / 1e9, "fp32 activations taken as twice bf16's: the dropout masks stay "
                   "1 byte")])
