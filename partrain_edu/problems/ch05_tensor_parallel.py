"""Problems of chapter 05 (tensor parallelism): the f/g all-reduces per layer, their time on a link, the memory a
tensor-parallel rank holds, what sequence parallelism saves, and TP's bytes against DDP's.

Keys come from `theory.traffic` (step_traffic, ring_bytes_sent, link_time) and `theory.memory` (estimate_memory,
model_state_bytes, activation_bytes_per_layer), the functions notebook 05 checks its traced collectives against.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory, model_state_bytes
from partrain_edu.theory.traffic import LINKS, link_time, ring_bytes_sent, step_traffic

MEGATRON = "Shoeybi et al. 2019 §3, Figure 4"
KORTHIKANTI = "Korthikanti et al. 2022 §4, Table 2"
# (name, Ψ, layers, hidden, heads): GPT-3's shapes (Brown et al. 2020, Table 2.1; 13B at hidden 5120, as OPT-13B)
# and Megatron-LM's 18.4B and 39.1B (Narayanan et al. 2021, Table 1)
MODELS = [("2.7B", 2.7e9, 32, 2560, 32), ("6.7B", 6.7e9, 32, 4096, 32), ("13B", 13e9, 40, 5120, 40),
          ("18.4B", 18.4e9, 40, 6144, 48), ("39.1B", 39.1e9, 48, 8192, 64), ("175B", 175e9, 96, 12288, 96)]


def _tp_bytes(layers, h, s, b, t, m=1, e=2):
    return step_traffic("tp", layers=layers, hidden=h, seq=s, micro_batch=b, tp=t, microbatches=m,
                        bytes_per_element=e).per_rank_bytes_sent


@problem("05.layer-all-reduces", "Bytes one rank sends in one layer's f and g", unit="MB", kind="one step",
         formula="4 all-reduces of b·s·h·2 bytes (2 forward, 2 backward), each 2(t−1)/t of it: 16(t−1)/t · bsh",
         source=f"{MEGATRON}; notebook 05, 'One layer on two ranks, every collective counted'")
def layer_all_reduces(rng) -> Drawn:
    t = rng.choice([2, 4, 8])
    h = rng.choice([2048, 4096, 5120, 8192, 12288])
    s = rng.choice([2048, 4096, 8192])
    b = rng.choice([1, 2, 4])
    key = _tp_bytes(1, h, s, b, t) / 1e6
    payload = b * s * h * 2
    return Drawn(f"One transformer layer (hidden {h}) runs tensor-parallel over tp = {t} ranks on a micro-batch "
                 f"of {b} sequence{'s' * (b > 1)} of {s} tokens, 16-bit activations. How many MB does one rank send "
                 "in the layer's f and g all-reduces, forward and backward together (ring model)?", key,
                 given={"t": t, "h": h, "s": s, "b": b},
                 mistakes=[(2 * ring_bytes_sent("all_reduce", payload, t) / 1e6,
                            "forward only: f and g also all-reduce twice in backward"),
                           (4 * 2 * payload / 1e6, "the (t−1)/t factor dropped: a ring rank sends 2(t−1)/t of "
                            "each payload"),
                           (_tp_bytes(1, h, s, b, t, e=4) / 1e6, "fp32 (4 bytes) for 16-bit activations")])


@problem("05.all-layers-on-a-link", "Time of TP's all-reduces for one micro-batch on one link", unit="ms",
         kind="several steps",
         formula="t = 4·L · 2(t−1)/t · b·s·h·2 / β (bandwidth only: the α–β model without α)",
         source=f"{MEGATRON}; Hockney 1994; notebook 05, 'Why TP stays inside one NVLink node'")
def all_layers_on_a_link(rng) -> Drawn:
    name, _, layers, h, _ = rng.choice(MODELS)
    t = rng.choice([2, 4, 8])
    s = rng.choice([2048, 4096])
    link = rng.choice(["nvlink", "infiniband"])
    label = {"nvlink": "NVLink 4", "infiniband": "InfiniBand NDR"}[link]
    sent = _tp_bytes(layers, h, s, 1, t)
    key = link_time(sent, link) * 1e3
    return Drawn(f"A {name} GPT ({layers} layers, hidden {h}) runs with tp = {t} and no pipeline, one sequence of "
                 f"{s} tokens per micro-batch, 16-bit activations. If its tp group talked over {label} "
                 f"({LINKS[link] / 1e9:g} GB/s per GPU, bandwidth only), how many ms would one micro-batch's TP "
                 "all-reduces (forward and backward) take?", key,
                 given={"layers": layers, "h": h, "t": t, "s": s, "beta": LINKS[link]},
                 mistakes=[(link_time(_tp_bytes(1, h, s, 1, t), link) * 1e3,
                            "one layer only: every one of the L layers all-reduces"),
                           (link_time(sent // 2, link) * 1e3, "forward only: backward all-reduces as much again"),
                           (link_time(4 * layers * 2 * s * h * 2, link) * 1e3,
                            "the (t−1)/t factor dropped: a ring rank sends 2(t−1)/t of each payload")])


@problem("05.tp-memory", "Memory per GPU under tensor parallelism", unit="GB", kind="several steps",
         formula="16Ψ/t + L · sbh(10 + 24/t + 5as/(ht)) (mixed-precision Adam; Korthikanti's TP row, 16-bit)",
         source=f"Rajbhandari et al. 2020 §3.1; {KORTHIKANTI}; notebook 05, 'Next step: sequence parallelism'")
def tp_memory(rng) -> Drawn:
    name, params, layers, h, a = rng.choice(MODELS)
    t = rng.choice([2, 4, 8])
    s = rng.choice([1024, 2048])
    b = rng.choice([1, 2])
    shape = {"layers": layers, "hidden": h, "heads": a, "seq": s, "micro_batch": b}
    split = estimate_memory(params, tp=t, **shape)
    key = split.total_bytes / 1e9
    states = split.total_bytes - split.activations_bytes
    whole_states = sum(model_state_bytes(int(params)))
    whole_acts = estimate_memory(params, **shape).activations_bytes
    return Drawn(f"A {name} GPT ({layers} layers, hidden {h}, {a} heads) trains with mixed-precision Adam (16 B "
                 f"per parameter) over tp = {t} GPUs, no pipeline, no data parallelism, micro-batch {b} × {s} "
                 "tokens. With 16-bit activations counted as Korthikanti et al. do (no recomputation, no sequence "
                 "parallelism), how many GB does one GPU hold for model states and activations together?", key,
                 given={"params": params, "layers": layers, "h": h, "a": a, "t": t, "s": s, "b": b},
                 mistakes=[((whole_states + split.activations_bytes) / 1e9, "the model states not divided by t: "
                            "each rank holds 1/t of every split matrix"),
                           ((states + whole_acts) / 1e9, "the activations not divided by t: only 10sbh of them "
                            "stay whole on every rank"),
                           (estimate_memory(params, tp=t, recompute="selective", **shape).total_bytes / 1e9,
                            "the attention scores 5as²b/t left out (that is selective recomputation)"),
                           (key * 1e9 / 2 ** 30, "GiB (2³⁰ B) for GB (10⁹ B)")])


@problem("05.sp-saving", "What sequence parallelism saves", unit="GB", kind="judgement",
         formula="TP keeps 10sbh per layer whole; TP + SP splits it t ways: saved = L · 10sbh · (1 − 1/t)",
         source=f"{KORTHIKANTI}, §4.2.2; notebook 05, 'Next step: sequence parallelism'")
def sp_saving(rng) -> Drawn:
    name, _, layers, h, a = rng.choice(MODELS)
    t = rng.choice([2, 4, 8])
    s = rng.choice([2048, 4096, 8192])
    b = rng.choice([1, 2, 4])

    def per_layer(sp: bool) -> int:
        return activation_bytes_per_layer(seq=s, micro_batch=b, hidden=h, heads=a, tp=t, sequence_parallel=sp)

    saved = per_layer(False) - per_layer(True)
    key = layers * saved / 1e9
    return Drawn(f"A {name} GPT ({layers} layers, hidden {h}, {a} heads) runs with tp = {t}, micro-batch {b} × "
                 f"{s} tokens, 16-bit activations, no recomputation. Tensor parallelism alone, or with sequence "
                 "parallelism: how many GB of activations per GPU does adding sequence parallelism save over all "
                 "layers?", key, given={"layers": layers, "h": h, "t": t, "s": s, "b": b},
                 mistakes=[(layers * 10 * s * b * h / 1e9, "the whole 10sbh removed: sequence parallelism keeps "
                            "1/t of it on each rank"),
                           (saved / 1e9, "one layer only: every layer saves as much"),
                           (key * 1e9 / 2 ** 30, "GiB (2³⁰ B) for GB (10⁹ B)")])


@problem("05.tp-vs-ddp", "Bytes per step: tensor parallelism against data parallelism", unit="×", kind="judgement",
         formula="TP / DDP = 4·L·m · 2(t−1)/t · bsh·2 / (2(t−1)/t · Ψ·2) = 4·L·m·bsh / Ψ",
         source=f"{MEGATRON}; Rajbhandari et al. 2020 §7.1; notebook 05, 'The whole model trains exactly like "
                "`single`'")
def tp_vs_ddp(rng) -> Drawn:
    name, params, layers, h, _ = rng.choice(MODELS)
    t = rng.choice([4, 8])
    s = rng.choice([1024, 2048, 4096])
    m = rng.choice([2, 4, 8, 16])
    tp = _tp_bytes(layers, h, s, 1, t, m=m)
    ddp = step_traffic("ddp", int(params), dp=t).per_rank_bytes_sent
    key = tp / ddp
    return Drawn(f"A {name} GPT ({layers} layers, hidden {h}) trains on {t} GPUs, {m} micro-batches of one "
                 f"{s}-token sequence per step, 16-bit activations and gradients. Tensor parallelism (tp = {t}) or "
                 f"DDP (dp = {t}): how many times the bytes of a DDP rank does a TP rank send per step (below 1: TP "
                 "sends less)?", key, given={"params": params, "layers": layers, "h": h, "t": t, "s": s, "m": m},
                 mistakes=[(key / m, "the micro-batches forgotten: TP all-reduces every layer for each of the m"),
                           (key / 2, "TP's forward all-reduces only: f and g all-reduce twice more in backward"),
                           (tp / (2 * params), "DDP's all-reduce counted as the gradient's size Ψ·2: a ring rank "
                            "sends 2(t−1)/t of it")])
