"""Problems of chapter 10 (context parallelism): the ring's bytes, GQA's all-gather, activations per rank, and how
long a sequence fits.

Keys come from `theory.traffic` (cp_bytes_per_layer, step_traffic "cp") and `theory.memory`
(activation_bytes_per_layer, estimate_memory with cp), the functions notebook 10 measures against; the Llama 3
shapes from `theory.model_spec.MODELS`.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.layout_memory import TIGHT
from partrain_edu.theory.memory import activation_bytes_per_layer, estimate_memory
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.traffic import cp_bytes_per_layer, step_traffic

RING = "Liu et al. 2023, Ring Attention §3"
KORTHIKANTI = "Korthikanti et al. 2022 §4, Table 2"
# GPT-3-like shapes (Brown et al. 2020, Table 2.1): (name, parameters, layers, hidden, heads)
SHAPES = [("1.3B", 1.3e9, 24, 2048, 16), ("2.7B", 2.7e9, 32, 2560, 32), ("6.7B", 6.7e9, 32, 4096, 32),
          ("13B", 13e9, 40, 5120, 40)]


@problem("10.gqa-all-gather", "Bytes one rank sends to all-gather one layer's K and V, with GQA", unit="MiB",
         kind="one step",
         formula="sent = (c−1)/c · 2 · T · kv · d · e (K and V: kv heads of width d, e bytes each)",
         source="Dubey et al. 2024 §3.3.2 (Llama 3's all-gather); Ainslie et al. 2023 (GQA); notebook 10, "
                "'PyTorch's own: context_parallel'")
def gqa_all_gather(rng) -> Drawn:
    name = rng.choice(["llama3-8b", "llama3-70b", "llama3-405b"])
    spec = MODELS[name]
    tokens = rng.choice([32768, 65536, 131072, 262144])
    cp = rng.choice([2, 4, 8, 16])

    def sent(width):
        return cp_bytes_per_layer(seq=tokens, micro_batch=1, hidden=width, cp=cp)["forward"] / 2**20

    key = sent(spec.kv_dim)
    return Drawn(f"{spec.name} has {spec.heads} query heads and {spec.kv} KV heads, each {spec.head_dim} wide. "
                 f"A sequence of {tokens:,} tokens is split over cp = {cp} ranks, and each rank all-gathers one "
                 "layer's K and V in bf16. How many MiB does one rank send?", key,
                 given={"heads": spec.heads, "kv": spec.kv, "head_dim": spec.head_dim, "tokens": tokens, "cp": cp},
                 mistakes=[(sent(spec.hidden), "K and V of every query head: with GQA only the KV heads have them"),
                           (sent(spec.kv_dim) * cp / (cp - 1), "the whole K and V: a rank sends only its own "
                            "block, to the c − 1 others"),
                           (sent(spec.kv_dim) / 2, "K only: V travels with it")])


@problem("10.ring-step", "Bytes one rank sends around the ring in a training step", unit="GB", kind="several steps",
         formula="per layer and micro-batch: forward (c−1)/c · 2bshe, backward twice that; × l layers × m",
         source=f"{RING}; notebook 10, 'The ring on 4 ranks' and 'train --strategy cp'")
def ring_step(rng) -> Drawn:
    name, _, layers, hidden, _ = rng.choice(SHAPES)
    seq = rng.choice([16384, 32768, 65536, 131072])
    cp = rng.choice([2, 4, 8])
    m = rng.choice([1, 2, 4, 8])
    key = step_traffic("cp", cp=cp, layers=layers, hidden=hidden, seq=seq, micro_batch=1,
                       microbatches=m).per_rank_bytes_sent / 1e9
    forward = cp_bytes_per_layer(seq=seq, micro_batch=1, hidden=hidden, cp=cp)["forward"] * layers * m / 1e9
    batches = f"{m} micro-batch{'es' if m > 1 else ''}"
    return Drawn(f"A {name} GPT ({layers} layers, hidden {hidden}, multi-head attention) trains on sequences of "
                 f"{seq:,} tokens with ring attention over cp = {cp} ranks, {batches} of one sequence per step, "
                 "bf16. How many GB does one rank send around the ring per step, forward and backward?", key,
                 given={"layers": layers, "hidden": hidden, "seq": seq, "cp": cp, "m": m},
                 mistakes=[(forward, "backward left out: it sends K and V again and the dK, dV "
                            "accumulators"),
                           (2 * forward, "backward's dK, dV accumulators left out"),
                           (key * cp / (cp - 1), "c hops counted: a block reaches the other c − 1 ranks "
                            "in c − 1"),
                           (key / m, "one micro-batch only: the ring runs for each of them")])


@problem("10.activations-per-rank", "Activations one rank keeps for one layer under cp", unit="GB", kind="one step",
         formula="sbh(34 + 5as/h) / c: every term over the rank's s/c queries (its scores: s/c queries × all s keys)",
         source=f"{KORTHIKANTI}; {RING}; notebook 10, 'Activation memory per rank: 1/n'")
def activations_per_rank(rng) -> Drawn:
    name, _, _, hidden, heads = rng.choice(SHAPES)
    seq = rng.choice([4096, 8192, 16384])
    cp = rng.choice([2, 4, 8])
    b = rng.choice([1, 2])
    shape = dict(micro_batch=b, hidden=hidden, heads=heads)
    key = activation_bytes_per_layer(seq=seq, cp=cp, **shape) / 1e9
    batch = f"{b} sequence{'s' if b > 1 else ''}"
    return Drawn(f"One layer of a {name} GPT (hidden {hidden}, {heads} heads) runs on micro-batches of {batch} of "
                 f"{seq:,} tokens, split over cp = {cp} ranks, without recomputation, 16-bit "
                 "activations (Korthikanti et al.'s table). How many GB does one rank keep for backward?", key,
                 given={"seq": seq, "b": b, "hidden": hidden, "heads": heads, "cp": cp},
                 mistakes=[(activation_bytes_per_layer(seq=seq // cp, **shape) / 1e9, "the keys split too: a rank's "
                            "s/c queries still score against all s keys"),
                           (activation_bytes_per_layer(seq=seq, **shape) / 1e9, "the whole sequence: each rank "
                            "keeps only its s/c positions"),
                           (activation_bytes_per_layer(seq=seq, cp=cp, recompute="selective", **shape) / 1e9,
                            "the attention scores 5as²b/c left out: without recompute they are kept")])


@problem("10.longest-sequence", "The longest sequence that fits with cp", unit="k tokens", kind="several steps",
         formula="16Ψ/N + l · 34 · (s/c) · h ≤ 0.9 · M (selective recompute, micro-batch 1): solve for s",
         source=f"Rajbhandari et al. 2020 §5; {KORTHIKANTI}; notebook 10, 'Activation memory per rank: 1/n'")
def longest_sequence(rng) -> Drawn:
    name, psi, layers, hidden, heads = rng.choice(SHAPES)
    n = rng.choice([8, 16, 32, 64])
    cp = rng.choice([2, 4, 8, 16])
    memory = 80e9

    def longest(budget, cp=cp, dp=n, element="mixed", states=True):
        est = estimate_memory(int(psi), dp=dp, zero=3, precision=element)
        per_position = layers * activation_bytes_per_layer(seq=cp, micro_batch=1, hidden=hidden, heads=heads,
                                                           recompute="selective", cp=cp,
                                                           element_bytes=2 if element == "mixed" else 4)
        return cp * (budget - (est.total_bytes if states else 0)) / per_position / 1e3

    key = longest(TIGHT * memory)
    slips = [(longest(memory), "the whole GPU used: keep 10 % free for the allocator"),
             (longest(TIGHT * memory, cp=1), "the split forgotten: each rank keeps only s/c positions"),
             (longest(TIGHT * memory, dp=1), "the model states unsharded: FSDP keeps 16Ψ/N per GPU"),
             (longest(TIGHT * memory, element="fp32"), "activations counted in fp32")]
    return Drawn(f"A {name} GPT ({layers} layers, hidden {hidden}) trains with FSDP: mixed-precision Adam states "
                 f"sharded over {n} ranks (ZeRO-3), and each sequence split over cp = {cp} ranks. With "
                 "micro-batches of one sequence, selective recompute and 16-bit activations (Korthikanti et al.'s "
                 f"table), how many thousand tokens can a sequence have, at most, within 90 % of an "
                 f"{memory / 1e9:g} GB GPU?", key,
                 given={"psi": psi, "layers": layers, "hidden": hidden, "n": n, "cp": cp, "memory": memory,
                        "tight": TIGHT},
                 mistakes=[(v, why) for v, why in slips if v > 0])


@problem("10.cp-or-tp", "Context or tensor parallelism: the activations cp saves", unit="GB", kind="judgement",
         formula="tp without sequence parallelism keeps sbh(10 + 24/n + 5as/(hn)); cp keeps sbh(34 + 5as/h)/n",
         source=f"{KORTHIKANTI}; {RING}; notebook 10, introduction and 'Activation memory per rank: 1/n'")
def cp_or_tp(rng) -> Drawn:
    name, _, _, hidden, heads = rng.choice(SHAPES)
    seq = rng.choice([8192, 16384, 32768])
    n = rng.choice([2, 4, 8])
    b = rng.choice([1, 2])
    shape = dict(seq=seq, micro_batch=b, hidden=hidden, heads=heads)
    tp = activation_bytes_per_layer(tp=n, **shape)
    key = (tp - activation_bytes_per_layer(cp=n, **shape)) / 1e9
    batch = f"{b} sequence{'s' if b > 1 else ''}"
    return Drawn(f"One layer of a {name} GPT (hidden {hidden}, {heads} heads) runs on micro-batches of {batch} of "
                 f"{seq:,} tokens over {n} GPUs, either with tensor parallelism (Megatron's, without sequence "
                 f"parallelism) or with context parallelism, cp = {n}. No recomputation, 16-bit "
                 "activations. How many GB fewer does each GPU keep for backward with context parallelism?", key,
                 given={"seq": seq, "b": b, "hidden": hidden, "heads": heads, "n": n},
                 mistakes=[(-key, "the sign: tensor parallelism keeps more, its 10sbh of layernorms and inputs whole"),
                           (0.0, "tensor parallelism taken with sequence parallelism, which splits those 10sbh too"),
                           ((tp - activation_bytes_per_layer(**(shape | {"seq": seq // n}))) / 1e9,
                            "cp's keys split too: a rank's s/c queries still score against all s keys")])
