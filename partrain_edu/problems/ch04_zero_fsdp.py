"""Problems of chapter 04 (ZeRO and FSDP): model states per GPU by stage, what a stage saves, what ZeRO-3's traffic
costs, and whether a model fits N × 80 GB: the fewest GPUs, the largest micro-batch.

Keys come from `theory.memory` (model_state_bytes, estimate_memory) and `theory.traffic` (step_traffic), the
functions notebook 04 sets its measured bytes per rank and per step against.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import estimate_memory, model_state_bytes
from partrain_edu.theory.traffic import step_traffic

GB = 1e9
DEVICE = 80e9                          # an "80 GB" H100, 80·10⁹ bytes
MODELS = [6.7, 7.5, 13, 30, 65, 70, 175, 405]        # billions of parameters
SHARDED = {0: "nothing", 1: "the optimizer states", 2: "the optimizer states and gradients",
           3: "the optimizer states, gradients and weights"}
# (name, layers, hidden, heads): GPT-3 6.7B, 13B, 175B (Brown et al. 2020, Table 2.1); LLaMA 30B, 65B (Touvron et
# al. 2023, Table 2)
SHAPES = [("6.7B", 32, 4096, 32), ("13B", 40, 5120, 40), ("30B", 60, 6656, 52), ("65B", 80, 8192, 64),
          ("175B", 96, 12288, 96)]
RECOMPUTE = {"selective": "selective recomputation", "full": "full recomputation"}
ZERO = "Rajbhandari et al. 2020 (ZeRO) §5, Figure 1"


def _states_gb(psi: int, n: int, k: int, optimizer: str = "adam") -> float:
    return sum(model_state_bytes(psi, dp=n, zero=k, optimizer=optimizer)) / GB


@problem("04.stage-bytes", "Model states per GPU under a ZeRO stage", unit="GB", kind="one step",
         formula="per GPU: stage 1 2Ψ + 2Ψ + 12Ψ/N, stage 2 2Ψ + 14Ψ/N, stage 3 16Ψ/N (mixed precision + Adam)",
         source=f"{ZERO}; notebook 04, 'Memory: measured per rank vs the ZeRO formulas'")
def stage_bytes(rng) -> Drawn:
    psi = int(rng.choice(MODELS) * 1e9)
    n = rng.choice([8, 16, 32, 64, 128, 256, 512, 1024])
    k = rng.choice([1, 2, 3])
    key = _states_gb(psi, n, k)
    fewer = {1: "nothing sharded: ZeRO-1 shards the optimizer states", 2: "the gradients left whole: ZeRO-2 "
             "shards them too", 3: "the weights left whole: ZeRO-3 shards them too"}
    more = {1: "the gradients sharded too: ZeRO-1 shards only the optimizer states",
            2: "the weights sharded too: ZeRO-2 keeps them whole on every GPU"}
    slips = [(_states_gb(psi, n, k - 1), fewer[k]),
             (_states_gb(psi, n, k, "sgd"), "Adam's states counted as 8 B: the fp32 master copy forgotten")]
    if k == 1:
        slips.append((key + 2 * psi / GB, "the whole weights counted in fp32 (4 B): the fp32 copy is the master, "
                      "sharded with the optimizer states"))
    if k < 3:
        slips.append((_states_gb(psi, n, k + 1), more[k]))
    else:
        slips.append((_states_gb(psi, n, 0), "nothing sharded: ZeRO-3 shards every state"))
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains with AdamW in mixed precision (16 B per parameter) "
                 f"under ZeRO-{k} over {n} data-parallel GPUs. How many GB of model states does each GPU hold?", key,
                 given={"psi": psi, "N": n, "k": k}, mistakes=slips)


@problem("04.stage-saving", "What a higher ZeRO stage saves per GPU", unit="GB", kind="judgement",
         formula="each state a stage adds to the shard shrinks from x·Ψ to x·Ψ/N: saved (1 − 1/N)·x·Ψ, with "
                 "x = 12 (optimizer), 2 (gradients), 2 (weights)",
         source=f"{ZERO}; notebook 04, 'Memory: measured per rank vs the ZeRO formulas'")
def stage_saving(rng) -> Drawn:
    psi = int(rng.choice(MODELS) * 1e9)
    n = rng.choice([4, 8, 16, 32, 64, 128, 256])
    low, high = rng.choice([(0, 1), (1, 2), (2, 3), (1, 3), (0, 3)])
    key = _states_gb(psi, n, low) - _states_gb(psi, n, high)
    whole = _states_gb(psi, 1, 0)
    full = [x / GB for x in model_state_bytes(psi)]                   # (weights, gradients, optimizer), unsharded
    gone = sum(full[i] for i, stage in ((2, 1), (1, 2), (0, 3)) if low < stage <= high)
    fp32 = (sum(model_state_bytes(psi, dp=n, zero=low, precision="fp32"))
            - sum(model_state_bytes(psi, dp=n, zero=high, precision="fp32"))) / GB
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains with AdamW in mixed precision (16 B per parameter, "
                 f"{whole:g} GB in all) over {n} data-parallel GPUs. How many GB of model states does each GPU hold "
                 f"less under ZeRO-{high} than under {f'ZeRO-{low}' if low else 'DDP'}?", key,
                 given={"psi": psi, "N": n, "low": low, "high": high},
                 mistakes=[(gone, "the sharded states counted as gone: each GPU still keeps 1/N "
                            "of them"),
                           (fp32, "fp32 weights and gradients (4 B each, no master copy): mixed "
                            "precision keeps 2 + 2 + 12"),
                           (n * key, "the saving over all N GPUs, not per GPU"),
                           (_states_gb(psi, n, high), f"the states ZeRO-{high} keeps, not what it "
                            "saves")])


@problem("04.zero3-traffic", "What ZeRO-3 sends more than ZeRO-2 under accumulation", unit="GB", kind="judgement",
         formula="per step: ZeRO-2 m·RS + 1·AG, ZeRO-3 m·(2·AG + RS), each (n−1)/n·Ψ·b: ZeRO-3 sends "
                 "(2m−1)·(n−1)/n·Ψ·b more",
         source="Rajbhandari et al. 2020 (ZeRO) §7.2; notebook 04, 'The price: ZeRO-3 sends 1.5× DDP's traffic, "
                "ZeRO-1 and ZeRO-2 the same'")
def zero3_traffic(rng) -> Drawn:
    psi = int(rng.choice(MODELS[:6]) * 1e9)
    n = rng.choice([8, 16, 32, 64])          # not 4: at m = 2 dropping (n−1)/n would equal ZeRO-1's count
    m = rng.choice([2, 4, 8, 16])

    def more(strategy: str = "zero2", microbatches: int = m) -> float:
        zero3 = step_traffic("zero3", psi, dp=n, microbatches=microbatches).per_rank_bytes_sent
        other = step_traffic(strategy, psi, dp=n, microbatches=microbatches).per_rank_bytes_sent
        return (zero3 - other) / GB

    key = more()
    return Drawn(f"A {psi / 1e9:g}B-parameter model in bf16 trains over {n} GPUs, accumulating {m} micro-batches "
                 "per optimizer step. How many GB more does one GPU send per step under ZeRO-3 (FSDP's full "
                 "sharding) than under ZeRO-2?", key, given={"psi": psi, "N": n, "m": m},
                 mistakes=[(more(microbatches=1), "the accumulation ignored: ZeRO-3 gathers the weights again for "
                            "every micro-batch"),
                           (more("zero1"), "ZeRO-2 counted like ZeRO-1, one reduce-scatter per step: its sharded "
                            "gradients are reduce-scattered every micro-batch"),
                           (key * n / (n - 1), "the (n−1)/n factor dropped from each collective")])


def _largest_micro_batch(psi: int, shape: tuple, n: int, k: int, seq: int, recompute: str,
                         counted=lambda est: est.total_bytes, budget: float = DEVICE, limit: int = 4096) -> int:
    """The largest micro-batch b ≤ `limit` whose estimate, read by `counted`, fits `budget` bytes; 0 if b = 1
    does not. Activations grow with b, so the first b that does not fit ends the search."""
    _, layers, hidden, heads = shape
    b = 0
    while b < limit:
        est = estimate_memory(psi, dp=n, zero=k, layers=layers, hidden=hidden, heads=heads, seq=seq,
                              micro_batch=b + 1, recompute=recompute)
        if counted(est) > budget:
            break
        b += 1
    return b


@problem("04.fit-micro-batch", "The largest micro-batch that fits N × 80 GB under ZeRO", unit="sequences",
         kind="several steps",
         formula="largest b with states_k(Ψ, N) + l·A(b) ≤ 80·10⁹ B: 16 B per parameter sharded by stage k, "
                 "activations per GPU not sharded (selective 34sbh, full 2sbh per layer)",
         source=f"{ZERO}; Korthikanti et al. 2022 Table 2; notebook 04, 'Memory: measured per rank vs the ZeRO "
                "formulas'; notebook 03, 'Activations'")
def fit_micro_batch(rng) -> Drawn:
    key = 0
    while not 1 <= key < 512:
        shape = rng.choice(SHAPES)
        psi = int(float(shape[0][:-1]) * 1e9)
        n = rng.choice([8, 16, 32, 64, 128, 256, 512])
        k = rng.choice([1, 2, 3])
        seq = rng.choice([2048, 4096, 8192])
        recompute = rng.choice(sorted(RECOMPUTE))
        key = _largest_micro_batch(psi, shape, n, k, seq, recompute)
    draw = (psi, shape, n, k, seq, recompute)
    slips = [(_largest_micro_batch(*draw, lambda est: est.total_bytes - est.activations_bytes * (n - 1) // n),
              "the activations sharded over the N GPUs too: ZeRO shards only the model states"),
             (_largest_micro_batch(*draw, budget=80 * 2**30), "80 GB read as 80 GiB"),
             (_largest_micro_batch(*draw, lambda est: est.total_bytes
                                   - est.activations_bytes * (shape[1] - 1) // shape[1]),
              "one layer's activations: every one of the l layers keeps its own")]
    if k < 3:
        slips.append((_largest_micro_batch(psi, shape, n, 3, seq, recompute), f"every state sharded: ZeRO-{k} "
                      f"keeps the weights{' and gradients' if k == 1 else ''} whole on each GPU"))
    else:
        slips.append((_largest_micro_batch(psi, shape, n, 0, seq, recompute), "nothing sharded: ZeRO-3 shards "
                      "the weights, gradients and optimizer states"))
    return Drawn(f"A {shape[0]}-parameter GPT ({shape[1]} layers, hidden {shape[2]}, {shape[3]} heads) trains "
                 f"with AdamW in mixed precision (16 B per parameter) under ZeRO-{k} over {n} GPUs of 80 GB "
                 f"(80·10⁹ B), at sequence length {seq} with {RECOMPUTE[recompute]} (bf16 activations). What is "
                 "the largest micro-batch, in sequences per GPU, that fits?", key,
                 given={"psi": psi, "layers": shape[1], "h": shape[2], "a": shape[3], "N": n, "k": k, "s": seq,
                        "recompute": recompute},
                 mistakes=slips)


def _fewest_gpus(psi: int, k: int, budget: float, optimizer: str = "adam") -> int:
    """The fewest GPUs N ≤ 4096 whose ZeRO-k model states per GPU fit `budget` bytes; 0 if none do."""
    return next((n for n in range(1, 4097) if _states_gb(psi, n, k, optimizer) * GB <= budget), 0)


@problem("04.fewest-gpus", "The fewest GPUs a ZeRO stage needs", unit="GPUs", kind="several steps",
         formula="smallest N with states_k(Ψ, N) ≤ 80·10⁹ B − R (stage 1: 4Ψ + 12Ψ/N, stage 2: 2Ψ + 14Ψ/N, "
                 "stage 3: 16Ψ/N)",
         source=f"{ZERO}; notebook 04, 'Memory: measured per rank vs the ZeRO formulas'")
def fewest_gpus(rng) -> Drawn:
    key = 0
    while key < 4:                      # a handful of GPUs at least, or every slip rounds to the same count
        psi = int(rng.choice(MODELS) * 1e9)
        k = rng.choice([1, 2, 3])
        reserve = rng.choice([10, 20, 30, 40, 50]) * 1e9
        key = _fewest_gpus(psi, k, DEVICE - reserve)
    slips = [(_fewest_gpus(psi, k, DEVICE), "the reserve forgotten: activations and buffers need it too"),
             (_fewest_gpus(psi, k, 80 * 2**30 - reserve), "80 GB read as 80 GiB"),
             (_fewest_gpus(psi, k, DEVICE - reserve, "sgd"), "Adam's states counted as 8 B: the fp32 master copy "
              "forgotten")]
    if k > 1:
        slips.append((_fewest_gpus(psi, k - 1, DEVICE - reserve), f"ZeRO-{k - 1}'s states: ZeRO-{k} also shards "
                      + ("the gradients" if k == 2 else "the weights")))
    if k < 3:
        slips.append((_fewest_gpus(psi, k + 1, DEVICE - reserve), f"ZeRO-{k + 1}'s states: ZeRO-{k} keeps "
                      + ("the gradients" if k == 1 else "the weights") + " whole on each GPU"))
    return Drawn(f"A {psi / 1e9:g}B-parameter model trains with AdamW in mixed precision (16 B per parameter) under "
                 f"ZeRO-{k}; each 80 GB GPU (80·10⁹ B) keeps {reserve / 1e9:g} GB free for activations and buffers. "
                 "Over how many data-parallel GPUs, at the fewest, do the model states fit?", key,
                 given={"psi": psi, "k": k, "R": reserve},
                 mistakes=[(value, why) for value, why in slips if value > 0])
