"""Timing a course strategy on the emulated device: TinyGPT's arithmetic, GPT-3 XL's seconds.

    partrain-edu train --strategy tp --nproc 2 --tp 2 --device emulated:a100 --json

TinyGPT's n blocks stand for GPT-3 XL's 24 layers (`theory.model_spec.MODELS["gpt-1.3b"]`): each block's forward
is charged 24/n × `theory.step_time.layer_forward_seconds` over this rank's micro-batch of 2048-token sequences
and its 1/tp of the heads (1/cp of the positions) — the calibrated model's compute at the device's fitted
efficiency —, its backward twice that; embeddings and head are not charged. Links are the calibrated model's
(`link_cost`). Messages are scaled to GPT-3 XL's: data-parallel gradients and parameters by its bf16 bytes over
TinyGPT's fp32 ones (fsdp-tp: of one tensor slice); activations, TP's all-reduces and CP's K/V blocks by s·h·2
over T·H·4 per sample, a block's TP and CP messages each standing for 24/n layers'. Unless the spec says
`scale=S`, one step's charged compute takes about a second of wall time (the same scale on every rank). Under
ZB-H1 (pp-zb1) a stage's B and W are charged one forward each. Timed: single, ddp, ddp-naive, zero1-3, tp,
tp-sp, cp, fsdp-tp and pp-*; the others refuse with one line (PyTorch's own run their communication in C++).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch.distributed as dist

from partrain_edu.models import Block, TinyGPT
from partrain_edu.theory.model_spec import MODELS
from partrain_edu.theory.step_time import layer_forward_seconds

MODEL = MODELS["gpt-1.3b"]          # GPT-3 XL (Brown et al. 2020): 24 layers, h 2048, s 2048
DATA_PARALLEL = ("single", "ddp", "ddp-naive", "zero1", "zero2", "zero3")
SPLIT = ("tp", "tp-sp", "cp", "fsdp-tp")   # our tensor and context parallelism, in Python: the emulator sees it
STEP_WALL_S = 1.0     # the wall time one step's charged compute should take when no scale is given


def check(cfg) -> None:
    """A one-line ValueError, before any process starts, if `cfg.strategy` cannot run on `cfg.device`."""
    timed = cfg.strategy in DATA_PARALLEL + SPLIT or cfg.strategy.startswith("pp-")
    if cfg.device != "cpu" and not timed:
        raise ValueError(f"--device {cfg.device}: {cfg.strategy} cannot be timed on the emulated device (its "
                         f"communication is out of reach); use one of {', '.join(DATA_PARALLEL + SPLIT)} or pp-*")


def layer_flops_per_token() -> float:
    """A training step's FLOPs per token in GPT-3 XL's layers: `ModelSpec.flops_per_token("none")` without the
    logits' 6·h·V (the layers only, as the device charges them): 72·l·h² + 12·l·s·h."""
    return MODEL.flops_per_token("none") - 3 * MODEL.forward_flops_per_token()["logits"]


def mfu(cfg, step_time_s: float, world_size: int, peak_flops: float) -> float:
    """Model FLOPs utilisation (Chowdhery et al. 2022, App. B): GPT-3 XL's layers' FLOPs over the global batch's
    tokens (`layer_flops_per_token`) over what the world_size devices could do at peak in step_time_s. The
    device computes at its fitted efficiency, so MFU < 1 is the kernels' shortfall from peak (small matrices,
    memory-bound elementwise work, per-layer overhead), then communication that did not hide and bubbles."""
    return layer_flops_per_token() * cfg.global_batch * MODEL.seq / (step_time_s * world_size * peak_flops)


def block_seconds(em, model_cfg, samples: int, tp: int = 1, cp: int = 1) -> float:
    """Emulated seconds of one TinyGPT block's forward over `samples` sequences on a rank holding 1/tp of the
    heads and 1/cp of the positions: 24/n of GPT-3 XL's layers, as the calibrated model prices one."""
    return layer_forward_seconds(MODEL, em.name, samples, tp=tp, cp=cp) * MODEL.layers / model_cfg.n_layer


def gradient_bytes_scale(model_cfg) -> float:
    """GPT-3 XL's bf16 parameter (or gradient) bytes per byte of TinyGPT's fp32 ones, whole models."""
    tiny = sum(p.numel() for p in TinyGPT(model_cfg).parameters())
    return MODEL.params() * 2 / (tiny * 4)


def activation_bytes_scale(model_cfg) -> float:
    """GPT-3 XL's bf16 activation bytes of one sequence (s·h·2) per TinyGPT's fp32 ones (T·H·4)."""
    return (MODEL.seq * MODEL.hidden * 2) / (model_cfg.seq_len * model_cfg.n_embd * 4)


def charge_tinygpt(em, model, samples: int, tp: int = 1, cp: int = 1) -> float:
    """Charge every block of a (wrapped) TinyGPT and scale its gradients' bytes to GPT-3 XL's bf16 ones; returns
    the bytes GPT-3 XL's gradients take. For any cell that times a data-parallel TinyGPT on the emulated device."""
    blocks = [b for b in model.modules() if isinstance(b, Block)]
    model_cfg = next(m for m in model.modules() if isinstance(m, TinyGPT)).cfg
    for block in blocks:
        em.charge(block, block_seconds(em, model_cfg, samples, tp, cp))
    em.bytes_scale = gradient_bytes_scale(model_cfg)     # whole models: a ZeRO-3 model holds shards
    return MODEL.params() * 2


def charged_apart(em, forward: list[float]):
    """For an executor whose B and W run apart: (kind, chunk) → a context that charges one forward of that chunk
    before the work (F, B or W alike, F = B = W) and records the real arithmetic inside it (`report`'s dominance)."""
    @contextmanager
    def charged(kind: str, chunk: int):
        em.compute(forward[chunk])
        wall = time.perf_counter()
        yield
        em.real_s += time.perf_counter() - wall
    return charged


def split_ways(strategy) -> tuple[int, int]:
    """(tp, cp): how many ways each of this rank's layers is split."""
    return strategy.tp, getattr(strategy, "cp", 1)


def charge_split(em, strategy, samples: int) -> None:
    """tp, tp-sp, cp, fsdp-tp: blocks charged their share; the tp group's collectives and the cp ring's sends
    priced as activations, 24/n layers' per message inside a block; the rest (cp's DDP gradients, fsdp-tp's
    gathers and reduce-scatters over dp) as GPT-3 XL's bf16 parameters."""
    cfg = strategy.cfg
    tp, cp = split_ways(strategy)
    charge_tinygpt(em, strategy.model, samples, tp, cp)
    per_layer = (activation_bytes_scale(cfg.model), MODEL.layers / cfg.model.n_layer)
    if tp > 1:
        em.traffic[("collective", tuple(dist.get_process_group_ranks(strategy.region.group)))] = per_layer
    if cp > 1:
        em.traffic[("p2p", tuple(dist.get_process_group_ranks(strategy.ring.group)))] = per_layer
    if hasattr(strategy.model, "flat_shards"):          # FSDP over each tensor slice: the slice's bytes
        tiny_slice = sum(fs.numel * fs.data.element_size() for fs in strategy.model.flat_shards())
        em.bytes_scale = MODEL.params() / tp * 2 / tiny_slice


def emulate(strategy) -> None:
    """Charge `strategy`'s blocks (or stages) on `strategy.ctx.emulator`; a one-line ValueError if it can't."""
    em, cfg = strategy.ctx.emulator, strategy.cfg
    check(cfg)
    m = cfg.microbatches
    samples = cfg.global_batch // (strategy.dp * m)         # sequences per micro-batch on this rank
    layer = block_seconds(em, cfg.model, samples, *split_ways(strategy))
    if hasattr(strategy, "executor"):                      # a pipeline: charge each stage its blocks
        forward = [len(chunk.blocks) * layer for chunk in strategy.chunks]   # one micro-batch through each chunk
        if strategy.schedule.split_backward:   # ZB: B and W are a backward's two products apart, one forward each
            strategy.executor.charged = charged_apart(em, forward)
        else:                                  # the forward, and twice it as the backward starts (compute.py)
            for chunk, seconds in zip(strategy.chunks, forward, strict=True):
                em.charge(chunk, seconds)
        # forward + backward (2×) of every micro-batch through an average stage: the same scale on every rank
        per_step = 3 * m * layer * cfg.model.n_layer / strategy.pp
        strategy.executor.clock = em.now
        em.bytes_scale = activation_bytes_scale(cfg.model)
    elif cfg.strategy in SPLIT:
        charge_split(em, strategy, samples)
        per_step = 3 * cfg.model.n_layer * layer * m       # the charged compute: from the configuration only
    else:
        if hasattr(strategy.model, "timeline"):            # our DDP: its overlap timeline on the emulated clock
            strategy.model.clock = em.now
        named = charge_tinygpt(em, strategy.model, samples)
        per_step = 3 * cfg.model.n_layer * layer * m + em.collective_seconds("all_reduce", named,
                                                                             range(strategy.dp))
    if em.auto_scale:   # from the configuration only: every rank must pick the same scale
        em.scale = STEP_WALL_S / per_step
