"""Problems of chapter 15 (efficiency): FLOPs per token, MFU against HFU, the roofline and the ridge point.

Keys come from `theory.efficiency` (flops_per_token, kaplan_flops_per_token, utilization, matmul_flops,
matmul_bytes, arithmetic_intensity, ridge_point, roofline_seconds) with the devices of `theory.hardware.DEVICES`
and `theory.memory.gpt_param_count`, the functions notebook 15 checks PyTorch's FLOP counter and its runs against.
"""
from __future__ import annotations

import math

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.efficiency import (
    arithmetic_intensity,
    flops_per_token,
    kaplan_flops_per_token,
    matmul_bytes,
    matmul_flops,
    ridge_point,
    roofline_seconds,
    utilization,
)
from partrain_edu.theory.hardware import DEVICES, ModelShape
from partrain_edu.theory.memory import gpt_param_count

NARAYANAN = "Narayanan et al. 2021 §5.1; Kaplan et al. 2020"
MFU = "Chowdhery et al. 2022, App. B; notebook 15, 'MFU and HFU on the emulated H100'"
ROOFLINE = "Williams et al. 2009; notebook 15, 'Arithmetic intensity and the roofline'"
SHAPES = [(24, 2048), (32, 4096), (40, 5120), (64, 8192), (80, 8192), (96, 12288)]   # (layers, hidden)
VOCABS = [32000, 50257, 128256]


def _gpt(rng) -> tuple[ModelShape, int]:
    layers, hidden = rng.choice(SHAPES)
    return ModelShape("", layers, hidden, rng.choice([2048, 4096, 8192])), rng.choice(VOCABS)


def _describe(shape: ModelShape, vocab: int) -> str:
    return f"l = {shape.layers}, h = {shape.hidden}, s = {shape.seq}, V = {vocab}"


def _device(rng):
    name = rng.choice(["a100", "h100"])
    d = DEVICES[name]
    return d, f"an {d.name} ({d.peak_flops / 1e12:g} TFLOP/s dense bf16, {d.hbm / 1e12:g} TB/s HBM)"


@problem("15.flops-per-token", "A training step's FLOPs per token", unit="GFLOPs", kind="one step",
         formula="per token: 72·l·h² (the layers' matmuls, ≈ 6Ψ) + 12·l·s·h (attention's s×s) + 6·h·V (the logits)",
         source=f"{NARAYANAN}; notebook 15, 'FLOPs per token: 6Ψ, and what it leaves out'")
def flops_per_token_(rng) -> Drawn:
    shape, vocab = _gpt(rng)
    key = flops_per_token(shape, vocab) / 1e9
    psi = gpt_param_count(shape.layers, shape.hidden, vocab, shape.seq)
    return Drawn(f"A GPT with {_describe(shape, vocab)} trains without recompute. How many GFLOPs does one "
                 "training step (forward and backward) cost per token, counting attention's s×s products and the "
                 "logits (Narayanan et al.)?", key,
                 given={"l": shape.layers, "h": shape.hidden, "s": shape.seq, "V": vocab},
                 mistakes=[(kaplan_flops_per_token(psi) / 1e9, "6Ψ: it counts the embeddings and "
                            "layernorms, which no matmul uses, and misses attention's 12·l·s·h"),
                           (flops_per_token(shape, 0) / 1e9, "the logits' 6·h·V left out"),
                           (key / 3, "forward only: backward costs twice the forward"),
                           (flops_per_token(shape, vocab, "full") / 1e9, "full recompute's fourth pass "
                            "counted: the run has none")])


@problem("15.mfu", "Model FLOPs utilisation from tokens per second", unit="%", kind="several steps",
         formula="MFU = tokens/s × (72·l·h² + 12·l·s·h + 6·h·V) / (N × peak FLOP/s)",
         source=f"{NARAYANAN}; {MFU}")
def mfu(rng) -> Drawn:
    shape, vocab = _gpt(rng)
    gpus = rng.choice([64, 128, 256, 512, 1024])
    device = DEVICES["h100"]
    per_token = flops_per_token(shape, vocab)
    target = rng.uniform(0.25, 0.55) * gpus * device.peak_flops / per_token
    tokens_s = float(f"{target:.3g}")
    key = 100 * utilization(per_token, tokens_s, gpus, device.peak_flops)
    psi = gpt_param_count(shape.layers, shape.hidden, vocab, shape.seq)
    return Drawn(f"A GPT with {_describe(shape, vocab)} trains on {gpus} H100s ({device.peak_flops / 1e12:g} TFLOP/s "
                 f"dense bf16 each) at {tokens_s:,.0f} tokens/s, without recompute. What is its MFU in %, with the "
                 "model's FLOPs per token counted as 72·l·h² + 12·l·s·h + 6·h·V?", key,
                 given={"l": shape.layers, "h": shape.hidden, "s": shape.seq, "V": vocab, "N": gpus,
                        "tokens_s": tokens_s, "peak": device.peak_flops},
                 mistakes=[(100 * utilization(kaplan_flops_per_token(psi), tokens_s, gpus,
                                              device.peak_flops), "6Ψ for the model's FLOPs per token"),
                           (key * gpus, "one GPU's peak: the tokens/s are the whole cluster's"),
                           (key / 2, "the peak with sparsity (twice the dense one)"),
                           (key / 3, "forward FLOPs only: a training step is three forwards' worth")])


@problem("15.roofline", "The least time of one matmul on the roofline", unit="µs", kind="one step",
         formula="t ≥ max(F / peak, B / HBM bandwidth), F = 2·m·k·n, B = 2·(m·k + k·n + m·n) bytes in bf16",
         source=ROOFLINE)
def roofline(rng) -> Drawn:
    device, said = _device(rng)
    hidden = rng.choice([2048, 4096, 8192])
    m = rng.choice([1, 16, 64, 256, 1024, 4096, 16384])
    n = rng.choice([hidden, 4 * hidden, hidden // 8])
    flops = matmul_flops(m, hidden, n)
    nbytes = matmul_bytes(m, hidden, n)
    key = roofline_seconds(flops, nbytes, device) * 1e6
    compute = flops / device.peak_flops * 1e6
    memory = nbytes / device.hbm * 1e6
    return Drawn(f"m = {m} tokens of width {hidden} go through a {hidden}×{n} bf16 weight, (m×k)·(k×n), on {said}. "
                 "By the roofline, reading both operands and writing the result once, how many µs does it take at "
                 "least?", key, given={"m": m, "k": hidden, "n": n, "peak": device.peak_flops, "hbm": device.hbm},
                 mistakes=[(compute, "the FLOPs' time only: compare it with the bytes' time"),
                           (memory, "the bytes' time only: compare it with the FLOPs' time"),
                           (compute + memory, "the two times added: they overlap, the longer one bounds"),
                           (roofline_seconds(flops / 2, nbytes, device) * 1e6, "one FLOP per "
                            "multiply-add: a matmul does 2·m·k·n"),
                           (roofline_seconds(flops, matmul_bytes(m, hidden, n, 4), device) * 1e6,
                            "4-byte elements: bf16 is 2 bytes")])


def _compute_bound_from(k: int, n: int, device, bytes_per_element: int = 2) -> int | None:
    """The fewest tokens m whose (m×k)·(k×n) matmul reaches the ridge point (the intensity grows with m: bisect);
    None where no m does (it tends to kn/((k + n)·e/2) FLOPs per byte)."""
    ridge = ridge_point(device)
    if arithmetic_intensity(10**12, k, n, bytes_per_element) < ridge:
        return None
    low, high = 0, 1                  # intensity(low) < ridge <= intensity(high)
    while arithmetic_intensity(high, k, n, bytes_per_element) < ridge:
        low, high = high, 2 * high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if arithmetic_intensity(mid, k, n, bytes_per_element) < ridge else (low, mid)
    return high


@problem("15.compute-bound", "Tokens a matmul needs to reach the ridge point", unit="tokens", kind="several steps",
         formula="intensity = 2mkn / (2(mk + kn + mn)) ≥ peak / bandwidth ⇔ m ≥ R·kn / (kn − R(k + n))",
         source=ROOFLINE)
def compute_bound(rng) -> Drawn:
    device, said = _device(rng)
    hidden = rng.choice([2048, 4096, 8192, 12288])
    tp = rng.choice([1, 2, 4])
    n = hidden // tp
    key = _compute_bound_from(hidden, n, device)
    shard = f" (a tp = {tp} shard)" if tp > 1 else ""
    ridge = ridge_point(device)
    slips = [(math.ceil(ridge), "intensity taken as m, the weight's bytes only: the activations in and out move "
              "bytes too"),
             (math.ceil(ridge / 2), "intensity taken as 2m, FLOPs per weight element: the ridge point counts bytes, "
              "2 per bf16 element")]
    fp32 = _compute_bound_from(hidden, n, device, 4)
    if fp32 is not None:        # 4-byte elements halve the intensity: some shapes then never reach the ridge
        slips.append((fp32, "4-byte elements: bf16 is 2 bytes"))
    return Drawn(f"On {said}, m tokens of width {hidden} go through a {hidden}×{n} bf16 weight{shard}, "
                 "reading both operands and writing the result once. What is the fewest tokens m for which this "
                 "matmul is compute-bound (its arithmetic intensity at least the ridge point)?", key,
                 given={"k": hidden, "n": n, "peak": device.peak_flops, "hbm": device.hbm},
                 mistakes=slips)


@problem("15.hfu-vs-mfu", "Comparing a run's HFU with another's MFU", unit="%", kind="judgement",
         formula="MFU = HFU × (72lh² + 12lsh + 6hV) / (96lh² + 16lsh + 6hV) under full recompute; compare MFUs",
         source=f"{NARAYANAN}; {MFU}")
def hfu_vs_mfu(rng) -> Drawn:
    shape, vocab = _gpt(rng)
    device = DEVICES["h100"]
    hfu_a = round(rng.uniform(45, 60), 1)
    tokens_a = hfu_a / 100 * device.peak_flops / flops_per_token(shape, vocab, "full")   # per GPU
    mfu_a = 100 * utilization(flops_per_token(shape, vocab), tokens_a, 1, device.peak_flops)
    mfu_b = round(mfu_a + rng.choice([-1, 1]) * rng.uniform(3, 9), 1)
    key = abs(mfu_b - mfu_a)
    psi = gpt_param_count(shape.layers, shape.hidden, vocab, shape.seq)
    rule = kaplan_flops_per_token(psi) / kaplan_flops_per_token(psi, recompute=True)
    return Drawn(f"Two runs train the same GPT ({_describe(shape, vocab)}) on the same H100s. Run A recomputes every "
                 f"layer's forward and reports HFU = {hfu_a:g} %; run B does not recompute and reports MFU = "
                 f"{mfu_b:g} %. By how many percentage points does the faster run's MFU exceed the slower run's?", key,
                 given={"l": shape.layers, "h": shape.hidden, "s": shape.seq, "V": vocab, "hfu_a": hfu_a,
                        "mfu_b": mfu_b},
                 mistakes=[(abs(hfu_a - mfu_b), "A's HFU compared with B's MFU: HFU counts the "
                            "recomputed forward, which trains nothing"),
                           (abs(hfu_a * rule - mfu_b), "the rule of thumb 6Ψ/8Ψ for A's ratio: attention "
                            "and the logits shift it"),
                           (abs(hfu_a * hfu_a / mfu_a - mfu_b), "the ratio turned over: MFU is below "
                            "HFU")])
