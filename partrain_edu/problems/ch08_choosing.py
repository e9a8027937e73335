"""Problems of chapter 08 (choosing a strategy): squeeze one device, the decision table, the planner's margin, a slow
network.

Keys come from `theory.memory` (estimate_memory, gpt_param_count), `theory.planner` (plan, assumed_shape,
SIMPLICITY_MARGIN), `theory.layout_memory.TIGHT` and `theory.network.group_seconds`: the functions notebook 08
runs. The network's link shares (NCCL's measured 96 %) are stated in the question, so that key is exact: it is not
the calibrated step-time model. The planner's problem states the step times the calibrated model gives; its key
is the planner's choice among them, exact given those numbers.
"""
from __future__ import annotations

import functools

from partrain_edu.problems.core import Drawn, problem, told_apart
from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.layout_memory import TIGHT
from partrain_edu.theory.memory import estimate_memory, gpt_param_count
from partrain_edu.theory.network import DATASHEET, EFFICIENCY, group_link, group_seconds
from partrain_edu.theory.planner import FAMILIES, SIMPLICITY_MARGIN, VOCAB, assumed_shape, plan
from partrain_edu.theory.traffic import LATENCY, LINKS, collective_time
from partrain_edu.units import parse_size

ZERO = "Rajbhandari et al. 2020 §5"
KORTHIKANTI = "Korthikanti et al. 2022 §4, Table 2"
NAMES = {"ddp": "DDP", "fsdp": "FSDP", "fsdp-tp": "FSDP × TP", "3d": "3D (TP + PP + DP)", "cp": "CP"}
# GPT-3's small shapes (Brown et al. 2020, Table 2.1): (name, parameters, layers, hidden, heads)
SMALL = [("350M", 0.35e9, 24, 1024, 16), ("760M", 0.76e9, 24, 1536, 16), ("1.3B", 1.3e9, 24, 2048, 16),
         ("2.7B", 2.7e9, 32, 2560, 32)]


def _most_sequences(psi: float, shape: dict, budget: float, states: bool = True) -> int:
    """The largest micro-batch whose stored bytes (`estimate_memory`: model states and activations) stay within
    `budget`; 0 if none. states=False leaves the optimizer states out (a slip)."""
    def stored(b):
        est = estimate_memory(int(psi), micro_batch=b, **shape)
        return est.total_bytes - (0 if states else est.optimizer_bytes)

    b = 0
    while b < 4096 and stored(b + 1) <= budget:
        b += 1
    return b


@problem("08.squeeze-micro-batch", "The largest micro-batch one device holds", unit="sequences",
         kind="several steps",
         formula="16Ψ + l · A(b) ≤ 0.9 · M, A(b) = sbh(34 + 5as/h) per layer (no recompute), 34sbh (selective)",
         source=f"{ZERO}; {KORTHIKANTI}; notebook 08, 'Step 0: squeeze one device first'")
def squeeze_micro_batch(rng) -> Drawn:
    key = 0
    while key < 1:
        name, psi, layers, hidden, heads = rng.choice(SMALL)
        seq = rng.choice([2048, 4096, 8192])
        recompute = rng.choice(["none", "selective"])
        memory = rng.choice([40, 80, 141]) * 1e9
        shape = dict(layers=layers, hidden=hidden, heads=heads, seq=seq, recompute=recompute)
        key = _most_sequences(psi, shape, TIGHT * memory)
    other = "selective" if recompute == "none" else "none"
    mistakes = [(_most_sequences(psi, shape, memory), "the whole GPU used: the planner keeps 10 % free for the "
                 "allocator's spikes"),
                (_most_sequences(psi, shape, TIGHT * memory, states=False), "the optimizer states left out: Adam's "
                 "fp32 master and two moments are 12 of the 16 bytes"),
                (_most_sequences(psi, shape | {"precision": "fp32"}, TIGHT * memory), "activations counted in fp32: "
                 "mixed precision keeps them in 16 bits"),
                (_most_sequences(psi, shape | {"recompute": other}, TIGHT * memory),
                 "the attention scores 5as²b counted though selective recompute drops them" if recompute == "selective"
                 else "the attention scores 5as²b left out: without recompute they are kept")]
    how = {"none": "no recomputation", "selective": "selective recomputation (attention's scores recomputed)"}
    return Drawn(f"A {name} GPT ({layers} layers, hidden {hidden}, {heads} heads; Ψ = {psi / 1e9:g}B) trains on one "
                 f"{memory / 1e9:g} GB GPU with mixed precision and Adam, sequences of {seq} tokens, {how[recompute]}. "
                 "Counting the model states and the activations kept for backward (Korthikanti et al.'s table), "
                 "what is the largest micro-batch, in sequences, within 90 % of the GPU's memory?", key,
                 given={"psi": psi, "layers": layers, "hidden": hidden, "heads": heads, "seq": seq,
                        "recompute": recompute, "memory": memory, "tight": TIGHT},
                 mistakes=mistakes)


@problem("08.one-layer", "One layer of a large model, with its Adam states", unit="GB", kind="one step",
         formula="one layer: 12h² + 13h parameters; 16 bytes each with mixed-precision Adam (2 + 2 + 12)",
         source=f"Narayanan et al. 2021 §5.1; {ZERO}; notebook 08, 'Where the notes are wrong'")
def one_layer(rng) -> Drawn:
    size = rng.choice(["13B", "20B", "30B", "65B", "70B", "100B", "175B", "280B", "400B", "540B", "1T"])
    hidden = assumed_shape(parse_size(size)).hidden
    layer = gpt_param_count(2, hidden, VOCAB, 2048) - gpt_param_count(1, hidden, VOCAB, 2048)
    est = estimate_memory(layer)
    key = est.total_bytes / 1e9
    return Drawn(f"The planner gives a GPT-3-like {size} model a hidden size of {hidden}. How many GB do one "
                 "transformer layer's parameters take with their mixed-precision Adam states (16-bit weights and "
                 "gradients, fp32 master copy and two moments)?", key, given={"hidden": hidden},
                 mistakes=[(est.params_bytes / 1e9, "only the 16-bit weights: the gradients, the master copy and "
                            "Adam's moments come with each parameter"),
                           ((est.params_bytes + est.grads_bytes) / 1e9, "the optimizer states left out: the fp32 "
                            "master and two moments are 12 of the 16 bytes"),
                           (estimate_memory(layer, optimizer="sgd").total_bytes / 1e9, "one moment only: Adam "
                            "keeps two, momentum and variance")])


@problem("08.zero1-or-fsdp", "DDP with ZeRO-1 or FSDP: the memory FSDP saves", unit="GB", kind="judgement",
         formula="ZeRO-1: 2Ψ + 2Ψ + 12Ψ/N; ZeRO-3 (FSDP): 16Ψ/N; FSDP saves 4Ψ(1 − 1/N)",
         source=f"{ZERO} and Figure 1; notebook 08, 'The decision table'")
def zero1_or_fsdp(rng) -> Drawn:
    psi = rng.randint(10, 300) * 1e8
    n = rng.choice([4, 8, 16, 32, 64])

    def states(zero, dp=n):
        return estimate_memory(int(psi), dp=dp, zero=zero)

    key = (states(1).total_bytes - states(3).total_bytes) / 1e9
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains with mixed precision and Adam on {n} GPUs, either as DDP "
                 "with ZeRO-1 (the optimizer states sharded) or as FSDP (ZeRO-3). How many GB of model states per "
                 "GPU does FSDP save?", key, given={"psi": psi, "n": n},
                 mistakes=[((states(0).total_bytes - states(3).total_bytes) / 1e9, "compared with plain "
                             "DDP: ZeRO-1 already shards the optimizer states"),
                            ((states(2).total_bytes - states(3).total_bytes) / 1e9, "ZeRO-1 taken to "
                             "shard the gradients too: that is ZeRO-2"),
                            ((states(1).params_bytes + states(1).grads_bytes) / 1e9, "FSDP's own shards "
                             "forgotten: each GPU still keeps 1/N of the weights and gradients")])


@problem("08.planner-margin", "The layout the planner takes", unit="s", kind="judgement",
         formula="take the first family (DDP, FSDP, FSDP × TP, 3D) whose fastest step ≤ 1.10 × the fastest of all",
         source="the source notes' decision order (决策顺序: TP/PP only when necessary); notebook 08, 'The decision "
                "table' (theory.planner.plan, SIMPLICITY_MARGIN)")
def planner_margin(rng) -> Drawn:
    mistakes = []
    while len(mistakes) < 2:        # the draws where the rule decides something
        size = rng.choice(["1.3B", "2.7B", "6.7B", "13B", "30B", "70B", "175B"])
        gpus = rng.choice([8, 16, 32, 64, 128, 256, 512, 1024])
        drawn = _planned(size, gpus)
        if drawn is None:           # it fits no layout of so few GPUs
            continue
        times, key = drawn
        shown = {f: float(f"{t:.4g}") for f, t in times.items()}
        # the stated, rounded times must lead to the same choice
        simplest = next(t for f, t in times.items() if shown[f] <= SIMPLICITY_MARGIN * min(shown.values()))
        fastest = min(times.values())
        elaborate = [t for t in times.values() if t <= SIMPLICITY_MARGIN * fastest][-1]
        slips = [(fastest, "the fastest layout taken: the planner prefers a simpler family within the margin"),
                 (next(iter(times.values())), "the simplest family taken without checking the margin"),
                 (elaborate, "the most elaborate family within the margin: the planner takes the simplest")]
        mistakes = told_apart(key, slips) if simplest == key else []   # the loop wants two a learner can make
    listed = ", ".join(f"{NAMES[f]} {shown[f]:g} s" for f in times)
    return Drawn(f"For a GPT-3-like {size} model on {gpus} H100s of 80 GB, the planner's fastest layout of each "
                 f"family that fits takes, per step: {listed}. It takes the simplest family (in that order) within "
                 f"{SIMPLICITY_MARGIN:.2f}× of the fastest. How many seconds per step does its choice take?", key,
                 given={"times": times, "margin": SIMPLICITY_MARGIN}, mistakes=mistakes)


@functools.lru_cache(maxsize=None)
def _planned(size: str, gpus: int) -> tuple[dict[str, float], float] | None:
    """({family: its fastest layout's step time}, simplest first; the chosen layout's) from `plan`, None if nothing
    fits; cached: every draw of the problem asks the planner again."""
    try:
        chosen = plan(size, gpus=gpus, gpu_memory="80GB")
    except ValueError:
        return None
    times = {f: chosen.families[f].step_time_s for f in FAMILIES if chosen.families.get(f) is not None}
    return times, chosen.layout.step_time_s


@problem("08.slow-network", "A DDP all-reduce over a slow network, against the compute", unit="×",
         kind="several steps",
         formula="t_comm = 2(n−1)·α + 2(n−1)/n · 2Ψ / (0.96 · link), t_compute = 6Ψ · tokens / F: t_comm / t_compute",
         source="Hockney 1994; Patarasuk & Yuan 2009; notebook 08, 'Pitfalls, as numbers'")
def slow_network(rng) -> Drawn:
    psi = rng.choice([0.35, 0.76, 1.3, 2.7, 6.7]) * 1e9
    n = rng.choice([4, 8, 16, 32])
    net = rng.choice(["infiniband", "10gbe", "1gbe"])
    seqs = rng.choice([4, 8, 16, 32])
    seq = rng.choice([2048, 4096])
    flops = rng.choice([300, 400, 500]) * 1e12
    h100 = device_named("h100")
    gbits = (h100.nic if net == "infiniband" else LINKS[net]) * 8 / 1e9
    compute = 6 * psi * seqs * seq / flops
    grads = 2 * int(psi)
    key = group_seconds("all_reduce", grads, n, 1, h100, network=net) / compute
    link = group_link(h100, n, 1, network=net)
    label = {"infiniband": "an InfiniBand port", "10gbe": "a 10 GbE port", "1gbe": "a 1 GbE port"}[net]
    share = EFFICIENCY["network"]
    return Drawn(f"DDP trains a {psi / 1e9:g}B model in bf16 on {n} machines of one GPU each, each on {label} of "
                 f"{gbits:g} Gb/s (NCCL reaches {share * 100:g} % of it; α = {LATENCY[net] * 1e6:g} µs per ring step). "
                 f"Each GPU computes {seqs} sequences of {seq} tokens per step at 6 FLOPs per parameter and token, at "
                 f"{flops / 1e12:g} TFLOP/s. How many times its compute time does the ring all-reduce of the "
                 "gradients take?", key,
                 given={"psi": psi, "n": n, "gbits": gbits, "alpha": LATENCY[net], "eff": share, "seqs": seqs,
                        "seq": seq, "flops": flops},
                 mistakes=[(group_seconds("all_reduce", grads, n, 1, h100, network=net, nic=gbits * 1e9)
                 / compute, "Gb/s read as GB/s: divide the bits by 8"),
                (group_seconds("all_reduce", grads, n, 1, h100, network=net, efficiency=DATASHEET)
                 / compute, "the link at its datasheet rate: NCCL reaches 96 % of it"),
                (collective_time("all_reduce", grads, n, alpha=0, beta=link.beta) / compute,
                 "the latency term 2(n−1)·α left out"),
                (group_seconds("all_reduce", 2 * grads, n, 1, h100, network=net) / compute,
                 "fp32 gradients: bf16 training all-reduces 2 bytes per parameter")])
