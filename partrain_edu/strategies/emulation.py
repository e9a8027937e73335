"""Timing a course strategy on the emulated device: TinyGPT's arithmetic, GPT-3 XL's seconds.

    partrain-edu train --strategy pp-1f1b --nproc 4 --pp 4 --microbatches 8 --device emulated:a100 --json

TinyGPT's n blocks stand for GPT-3 XL's 24 layers: each is charged 24/n of its layers over this rank's
micro-batch of 2048-token sequences (`theory.hardware.layer_seconds`); embeddings and head are not charged, so
equal blocks make equal stages (the premise of the bubble formula). Messages are scaled to what the 1.3B model
would send: data-parallel gradients and parameters by its bf16 bytes over TinyGPT's fp32 ones, activations by
s·h·2 over T·H·4 per sample. Unless the device spec says `scale=S`, one step (compute and, for data parallelism, its all-reduce)
takes about a second of wall time. Under ZB-H1 (pp-zb1) a stage's B and W are charged one forward each.
Timed: single, ddp, ddp-naive, zero1, zero2, zero3 and pp-*; the others refuse with one line (PyTorch's own
run their communication in C++, out of the emulator's reach; tensor parallelism is not modelled yet).
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from partrain_edu.models import Block, TinyGPT
from partrain_edu.theory.hardware import GPT_1_3B, layer_forward_flops, layer_seconds
from partrain_edu.theory.memory import gpt_param_count

SHAPE = GPT_1_3B
DATA_PARALLEL = ("single", "ddp", "ddp-naive", "zero1", "zero2", "zero3")
STEP_WALL_S = 1.0     # the wall time one step's charged compute should take when no scale is given


def check(cfg) -> None:
    """A one-line ValueError, before any process starts, if `cfg.strategy` cannot run on `cfg.device`."""
    if cfg.device != "cpu" and cfg.strategy not in DATA_PARALLEL and not cfg.strategy.startswith("pp-"):
        raise ValueError(f"--device {cfg.device}: {cfg.strategy} cannot be timed on the emulated device (its "
                         f"communication is out of reach); use one of {', '.join(DATA_PARALLEL)} or pp-*")


def mfu(cfg, step_time_s: float, world_size: int, peak_flops: float) -> float:
    """Model FLOPs utilisation (Chowdhery et al. 2022, App. B): the model's FLOPs per step — forward and backward
    (3×) of GPT-3 XL's layers over the global batch; embeddings and logits are not charged — over what the
    world_size devices could do at peak in step_time_s. The emulated device computes at peak, so what is lost
    here is communication that did not hide and pipeline bubbles (a real GPU's kernels also lose 40–60 %)."""
    flops = 3 * SHAPE.layers * layer_forward_flops(SHAPE, cfg.global_batch)
    return flops / (step_time_s * world_size * peak_flops)


def block_seconds(em, model_cfg, samples: int) -> float:
    """Emulated seconds of one TinyGPT block's forward over `samples` sequences: TinyGPT's n blocks stand for
    GPT-3 XL's 24 layers, so each costs 24/n of them — a step's compute and its gradients are one model's."""
    return layer_seconds(SHAPE, samples, em.device) * SHAPE.layers / model_cfg.n_layer


def charge_tinygpt(em, model, samples: int) -> float:
    """Charge every block of a (wrapped) TinyGPT and scale its gradients' bytes to GPT-3 XL's bf16 ones; returns
    the bytes GPT-3 XL's gradients take. For any cell that times a data-parallel TinyGPT on the emulated device."""
    blocks = [b for b in model.modules() if isinstance(b, Block)]
    model_cfg = next(m for m in model.modules() if isinstance(m, TinyGPT)).cfg
    for block in blocks:
        em.charge(block, block_seconds(em, model_cfg, samples))
    tiny = sum(p.numel() for p in TinyGPT(model_cfg).parameters())       # whole: a ZeRO-3 model holds shards
    named = gpt_param_count(SHAPE.layers, SHAPE.hidden, 50257, SHAPE.seq) * 2
    em.bytes_scale = named / (tiny * 4)
    return named


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


def emulate(strategy) -> None:
    """Charge `strategy`'s blocks (or stages) on `strategy.ctx.emulator`; a one-line ValueError if it can't."""
    em, cfg = strategy.ctx.emulator, strategy.cfg
    check(cfg)
    m = cfg.microbatches
    samples = cfg.global_batch // (strategy.dp * m)         # sequences per micro-batch on this rank
    layer = block_seconds(em, cfg.model, samples)
    if hasattr(strategy, "executor"):                      # a pipeline: charge each stage its blocks
        forward = [len(chunk.blocks) * layer for chunk in strategy.chunks]   # one micro-batch through each chunk
        if strategy.schedule.split_backward:   # ZB: B and W are a backward's two products apart, one forward each
            strategy.executor.charged = charged_apart(em, forward)
        else:                                  # the forward, and twice it as the backward starts (compute.py)
            for chunk, seconds in zip(strategy.chunks, forward):
                em.charge(chunk, seconds)
        # forward + backward (2×) of every micro-batch through an average stage: the same scale on every rank
        per_step = 3 * m * layer * cfg.model.n_layer / strategy.pp
        strategy.executor.clock = em.now
        em.bytes_scale = (SHAPE.seq * SHAPE.hidden * 2) / (cfg.model.seq_len * cfg.model.n_embd * 4)
    else:
        if hasattr(strategy.model, "timeline"):            # our DDP: its overlap timeline on the emulated clock
            strategy.model.clock = em.now
        named = charge_tinygpt(em, strategy.model, samples)
        per_step = 3 * cfg.model.n_layer * layer * m + em.collective_seconds("all_reduce", named,
                                                                             range(strategy.dp))
    if em.auto_scale:   # from the configuration only: every rank must pick the same scale
        em.scale = STEP_WALL_S / per_step
