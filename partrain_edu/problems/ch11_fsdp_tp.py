"""Problems of chapter 11 (FSDP × tensor parallelism): the dp group's β, FSDP's tokens per GPU, its intensity, the
ring latency tp cuts, and the batch's floor on tp.

Keys come from `theory.network` (group_link, group_seconds: β = min(NVLink · 0.82, k · NIC · 0.96) for k members
per node) and `theory.batch_limit` (dp_bandwidth, critical_tokens, fsdp_tokens_per_gpu, fsdp_intensity,
max_dp_for_batch, min_tp_for_batch), the functions notebook 11 prints. The link shares are NCCL's measured bus
bandwidths, not fitted (`theory.calibration`: "The links are not fitted"); each question states them, so its key is
exact: none of these keys is the calibrated step-time model's.
"""
from __future__ import annotations

import math
from dataclasses import replace

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.batch_limit import (
    critical_tokens,
    dp_bandwidth,
    fsdp_intensity,
    fsdp_tokens_per_gpu,
    max_dp_for_batch,
    min_tp_for_batch,
)
from partrain_edu.theory.hardware import device_named
from partrain_edu.theory.network import DATASHEET, EFFICIENCY, group_link, group_seconds
from partrain_edu.theory.traffic import LATENCY, collective_time, step_traffic

NODE = 8
AUSTIN = "Austin et al. 2025, How to Scale Your Model, GPU chapter"
NETWORK = "theory.network.group_link; NVIDIA/nccl-tests #212 and #267"


def _device(rng):
    """A device preset and the sentence that states its links."""
    dev = device_named(rng.choice(["h100-sxm", "a100-80gb", "h800"]))
    said = (f"{dev.name} GPUs, {NODE} per node (NVLink {dev.nvlink / 1e9:g} GB/s each way, one {dev.nic / 1e9:g} GB/s "
            f"NIC per GPU; NCCL reaches {EFFICIENCY['nvlink'] * 100:g} % of NVLink and "
            f"{EFFICIENCY['network'] * 100:g} % of a NIC)")
    return dev, said


def _links(dev) -> dict:
    return {"nvlink": dev.nvlink, "nic": dev.nic, "eta_nvlink": EFFICIENCY["nvlink"],
            "eta_net": EFFICIENCY["network"], "node": NODE}


@problem("11.dp-beta", "β each member of FSDP's dp group gets", unit="GB/s", kind="one step",
         formula="k = node/tp members per node: β = min(NVLink · 0.82, k · NIC · 0.96) (k · NIC · 0.96 for k = 1)",
         source=f"{AUSTIN} (B / W_node egress); {NETWORK}; notebook 11, 'Why 2D: the batch runs out'")
def dp_beta(rng) -> Drawn:
    dev, said = _device(rng)
    tp = rng.choice([1, 2, 4, 8])
    gpus = rng.choice([64, 128, 256, 512, 1024])
    members = gpus // tp
    k = NODE // tp
    key = dp_bandwidth(dev, tp, NODE, gpus=gpus) / 1e9
    return Drawn(f"A dp × tp grid of {gpus} {said} runs tp = {tp} inside each node and FSDP over the dp groups. "
                 "How many GB/s does a dp group's ring give each member?", key,
                 given=_links(dev) | {"tp": tp},
                 mistakes=[(group_link(dev, members, k, efficiency=DATASHEET).beta / 1e9,
                            "the datasheet rates: NCCL reaches 82 % of NVLink and 96 % of a NIC"),
                           (group_link(replace(dev, nvlink=math.inf), members, k).beta / 1e9,
                            "the NVLink cap forgotten: the node's NICs are fed over NVLink"),
                           (group_link(dev, members, 1).beta / 1e9, "one NIC: the group's k members on a "
                            "node cross the network on k NICs at once"),
                           (group_link(dev, k, k).beta / 1e9, "priced on NVLink alone: the group leaves "
                            "the node")])


@problem("11.tokens-per-gpu", "FSDP's tokens per GPU to hide its traffic", unit="tokens", kind="several steps",
         formula="t_GPU = (e/2) · F / (tp · β), β = min(NVLink · 0.82, (node/tp) · NIC · 0.96)",
         source=f"{AUSTIN} ('about 2500 tokens per GPU'); notebook 11, 'Why 2D: the batch runs out'")
def tokens_per_gpu(rng) -> Drawn:
    dev, said = _device(rng)
    tp = rng.choice([1, 2, 4, 8])
    share = rng.choice([1.0, 0.6, 0.5, 0.4])
    flops = share * dev.peak_flops
    k = NODE // tp
    key = fsdp_tokens_per_gpu(dev, tp, NODE, flops=flops)
    beta = dp_bandwidth(dev, tp, NODE)
    rate = "at its peak" if share == 1 else f"at {share * 100:g} % of its peak"
    return Drawn(f"FSDP runs across whole nodes of {said}, with tp = {tp} inside each node. Each GPU computes "
                 f"{rate} of {dev.peak_flops / 1e12:g} TFLOP/s in bf16. From how many tokens per GPU does FSDP's "
                 "traffic hide behind compute (many replicas: (n−1)/n ≈ 1)?", key,
                 given=_links(dev) | {"tp": tp, "flops": flops, "e": 2},
                 mistakes=[(critical_tokens(flops, beta), "tokens per replica: a replica spans tp GPUs"),
                           (critical_tokens(flops, group_link(dev, 2 * k, 1).beta) / tp, "one NIC per dp "
                            "group: its k members on a node cross on k NICs"),
                           (critical_tokens(flops, group_link(dev, 2 * k, k, efficiency=DATASHEET).beta)
                            / tp, "the datasheet rates: NCCL reaches 82 % of NVLink and 96 % of a NIC"),
                           (critical_tokens(flops, beta, 4) / tp, "4-byte gradients: bf16 moves 2")])


@problem("11.intensity-margin", "FSDP's intensity against F/β", unit="×", kind="several steps",
         formula="intensity = 6(Ψ/tp)t / (3(n−1)/n · (Ψ/tp) · e) = 2tn/((n−1)e) against F/β: the ratio",
         source=f"{AUSTIN} §5; notebook 11, 'Why 2D: the batch runs out'")
def intensity_margin(rng) -> Drawn:
    dev, said = _device(rng)
    psi = rng.choice([1.3, 2.7, 6.7, 7.5, 13, 30, 70]) * 1e9
    gpus = rng.choice([128, 256, 512, 1024])
    tp = rng.choice([1, 2, 4, 8])
    batch = rng.choice([512, 1024, 2048])
    seq = rng.choice([2048, 4096, 8192])
    while gpus // tp > batch:       # a replica needs at least one whole sequence
        tp *= 2
    dp = gpus // tp
    tokens = batch * seq / dp                      # per replica: a replica spans tp GPUs
    need = dev.peak_flops / dp_bandwidth(dev, tp, NODE, gpus=gpus)
    key = fsdp_intensity(int(psi), tokens, dp, tp) / need
    ddp = 6 * psi / tp * tokens / step_traffic("ddp", int(psi), dp=dp, tp=tp).per_rank_bytes_sent
    return Drawn(f"A {psi / 1e9:g}B model trains on {gpus} {said}, at their peak of {dev.peak_flops / 1e12:g} "
                 f"TFLOP/s, with tp = {tp} inside each node and FSDP (bf16) over the rest; a step is {batch} sequences "
                 f"of {seq} tokens. FSDP's arithmetic intensity (FLOPs per byte a GPU sends along dp) is how many "
                 "times F/β, β what the dp group's ring gives each member?",
                 key, given=_links(dev) | {"gpus": gpus, "tp": tp, "batch": batch, "seq": seq,
                                           "flops": dev.peak_flops, "e": 2},
                 mistakes=[(fsdp_intensity(int(psi), tokens / tp, dp, tp) / need, "the replica's tokens "
                            "split over tp: the tp GPUs of a replica compute the same tokens"),
                           (ddp / need, "DDP's 2Ψe bytes: FSDP gathers twice and reduce-scatters, 3Ψe"),
                           (fsdp_intensity(int(psi), tokens, dp, tp) * group_link(dev, dp, 1).beta
                            / dev.peak_flops, "β of one NIC: the dp group has node/tp members per node")])


@problem("11.latency-tp", "FSDP alone or with tp = 8: the gather's ring latency", unit="×", kind="judgement",
         formula="t = (n−1)·α + (n−1)/n · S / β; FSDP alone: n = G, β over 8 NICs; tp: n = G/tp, S/tp, β over 8/tp",
         source=f"PyTorch 2D tutorial ('When and Why you should apply Tensor Parallel'); Hockney 1994; {AUSTIN}; "
                "notebook 11, 'The tutorial's first reason: ring latency'")
def latency_tp(rng) -> Drawn:
    dev, said = _device(rng)
    gpus = rng.choice([256, 512, 1024, 2048])
    tp = rng.choice([2, 4, 8])
    size = rng.randint(100, 1500) * 1_000_000
    alpha = LATENCY["infiniband"]

    def gather(nbytes, members, per_node):
        return group_seconds("all_gather", nbytes, members, per_node, dev)

    alone = gather(size, gpus, NODE)
    key = alone / gather(size // tp, gpus // tp, NODE // tp)
    bytes_only = [collective_time("all_gather", s, m, alpha=0, beta=group_link(dev, m, k).beta)
                  for s, m, k in ((size, gpus, NODE), (size // tp, gpus // tp, NODE // tp))]
    return Drawn(f"FSDP all-gathers one {size / 1e6:g} MB unit of bf16 parameters over {gpus} {said}, with a "
                 f"ring of α = {alpha * 1e6:g} µs per step. With tp = {tp} inside each node instead, each GPU gathers "
                 "only its tp slice over its dp group. How many times faster is the tp layout's gather?", key,
                 given=_links(dev) | {"gpus": gpus, "tp": tp, "S": size, "alpha": alpha},
                 mistakes=[(bytes_only[0] / bytes_only[1], "the latency left out: (n−1)·α is what tp "
                            "cuts"),
                           (alone / gather(size, gpus // tp, NODE // tp), "the whole unit gathered under "
                            "tp: each GPU gathers only its 1/tp slice"),
                           (alone / gather(size // tp, gpus // tp, NODE), "the tp layout's dp group "
                            "priced on all the node's NICs: it has node/tp members per node"),
                           (1 / key, "the ratio turned over: how many times faster is the tp layout")])


@problem("11.batch-floor", "The smallest tp a bounded batch asks for", unit="", kind="one step",
         formula="n ≤ ⌊B / b_min⌋ replicas, so tp ≥ G · b_min / B: the smallest tp dividing the node (1, 2, 4, 8)",
         source="McCandlish et al. 2018; Kaplan et al. 2020; notebook 11, 'Why 2D: the batch runs out'")
def batch_floor(rng) -> Drawn:
    key = 0
    while key not in (2, 4, 8):     # a tp group inside one node of 8 (the function also allows 3 or 6)
        gpus = NODE * rng.choice([96, 128, 192, 256, 384, 512, 768, 1024])
        batch = rng.choice([256, 512, 768, 1024, 1536, 2048])
        least = rng.choice([2, 4])
        try:
            key = min_tp_for_batch(gpus, batch, least)
        except ValueError:          # more than tp = 8 would be needed
            key = 0
    return Drawn(f"{gpus} GPUs in nodes of {NODE} train with a global batch of {batch} sequences, and each "
                 f"data-parallel replica needs at least {least} sequence{'s' if least > 1 else ''}. What is the "
                 f"smallest tensor-parallel degree dividing a node's {NODE} GPUs that leaves no more replicas than "
                 "the batch feeds?", key, given={"gpus": gpus, "batch": batch, "least": least},
                 mistakes=[(gpus * least / batch, "the bound G · b_min / B not rounded up to a degree "
                            "that divides the node"),
                           (min_tp_for_batch(gpus, batch, 1), "b_min left out: each replica needs at "
                            "least that many sequences"),
                           (min_tp_for_batch(gpus, batch * least, 1), "b_min multiplied in: the "
                            "batch feeds at most B / b_min replicas"),
                           (max_dp_for_batch(batch, least), "the most replicas ⌊B / b_min⌋: the "
                            "question asks for tp, the GPUs over them")])
