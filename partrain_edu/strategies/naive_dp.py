"""`naive-dp`: `torch.nn.DataParallel`'s single-process pattern, rebuilt to show why PyTorch recommends DDP instead.

    partrain-edu train --strategy naive-dp --nproc 4 --steps 20 --json     (4 replicas, ONE process)

Sharded: nothing but the batch. One process drives N replicas (one thread each); device 0 holds the master
model, the optimizer and the loss, and every byte goes through it (the class docstring lists the 7 transfers).
Sent through device 0 per micro-batch of B sequences, T tokens, V logits each, with Ψ parameters (fp32):

    ≈ 2(N−1) · Ψ·4 + 2(N−1)/N · B·T·V·4     (DDP: each rank sends 2(N−1)/N · Ψ·4, below 2 · Ψ·4 for any N)

Device 0 is the bandwidth and memory hotspot, and the threads share one GIL. One process cannot span machines at
all, and every replica holds the whole model (DataParallel splits the batch, never the model). PyTorch's
documentation recommends DistributedDataParallel even on one machine (a 2021 proposal to deprecate DataParallel,
pytorch/pytorch#65936, was not carried out). On a CPU the GIL costs little — torch's kernels release it and the
"devices" share one memory — so this rebuild shows the bytes, not the slowdown. The math is still exact (the
gathered outputs' loss is the whole batch's mean), so the losses match `single`.
"""
from __future__ import annotations

import copy
import threading
from typing import Callable, Sequence

import torch

from partrain_edu.data import split_microbatches
from partrain_edu.models import TinyGPT
from partrain_edu.strategies.base import Strategy, register, tensor_bytes

# The transfers through device 0, and their direction.
TRANSFERS = {"scatter inputs": "out", "replicate parameters": "out", "gather outputs": "in",
             "scatter output gradients": "out", "reduce gradients": "in"}


def device0_bytes(n: int, param_bytes: int, input_bytes: int, output_bytes: int, microbatches: int = 1) -> dict:
    """What the formulas say flows through device 0 in one step: {transfer: bytes}. `input_bytes` and
    `output_bytes` are the whole step's batch of inputs and outputs; an even split over n devices."""
    share = (n - 1) * microbatches
    return {"scatter inputs": (n - 1) * input_bytes // n, "replicate parameters": share * param_bytes,
            "gather outputs": (n - 1) * output_bytes // n, "scatter output gradients": (n - 1) * output_bytes // n,
            "reduce gradients": share * param_bytes}


def in_threads(fn: Callable, items: Sequence) -> list:
    """fn(item) for every item, each in its own thread (DataParallel's `parallel_apply`); re-raises the first
    error. Torch releases the GIL inside its kernels, but the Python between them runs one thread at a time."""
    results, errors = [None] * len(items), [None] * len(items)

    def work(i: int) -> None:
        try:
            results[i] = fn(items[i])
        except BaseException as error:  # noqa: BLE001 - handed to the caller below
            errors[i] = error

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for error in errors:
        if error is not None:
            raise error
    return results


@register("naive-dp")
class NaiveDataParallel(Strategy):
    """Per micro-batch, with Ψ parameters (4 bytes each), a batch of B sequences of T tokens, a vocabulary V:

      1. scatter    the input rows to the other devices               out of device 0: (N−1)/N · B·T·8 (int64)
      2. replicate  the parameters into the other replicas            out of device 0: (N−1) · Ψ·4
      3. parallel forward, one thread per replica
      4. gather     the outputs (logits) onto device 0 for the loss   into device 0:   (N−1)/N · B·T·V·4
      5. scatter    the loss gradient of those outputs back           out of device 0: (N−1)/N · B·T·V·4
      6. parallel backward, one thread per replica
      7. reduce     the replicas' gradients onto device 0 (a sum)     into device 0:   (N−1) · Ψ·4
      8. the optimizer steps on device 0 only; the replicas are overwritten at the next replicate

    `traffic` keeps, per step, the bytes of each transfer through device 0, checked against `device0_bytes`."""

    in_process = True   # N replicas, one process: `train` runs it in place, --nproc is the number of replicas

    def __init__(self, ctx, cfg):
        super().__init__(ctx, cfg)
        self.model = self.new_model()                                   # device 0: the master copy
        self.optimizer = self.new_optimizer(self.model.parameters())    # device 0 only
        self.replicas = [self.model] + [copy.deepcopy(self.model) for _ in range(self.dp - 1)]
        self.param_bytes = tensor_bytes(self.model.parameters())
        self.traffic: list[dict[str, int]] = []                         # per step: bytes through device 0

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        moved = dict.fromkeys(TRANSFERS, 0)
        chunks = split_microbatches(x.to(self.ctx.device), y.to(self.ctx.device), self.cfg.microbatches)
        loss_sum = 0.0
        for xb, yb in chunks:
            loss = self._forward_backward(xb, yb, 1.0 / len(chunks), moved)
            loss_sum += loss * xb.size(0)
        self.traffic.append(moved)
        self.optimizer.step()
        return loss_sum, x.size(0)

    def _forward_backward(self, x: torch.Tensor, y: torch.Tensor, weight: float, moved: dict) -> float:
        n = len(self.replicas)
        xs = list(x.chunk(n))                                          # 1. scatter: (B/N, T) each
        moved["scatter inputs"] += sum(tensor_bytes([t]) for t in xs[1:])
        with torch.no_grad():                                          # 2. replicate
            for replica in self.replicas[1:]:
                for mine, master in zip(replica.parameters(), self.model.parameters(), strict=True):
                    mine.copy_(master)
                    mine.grad = None
        moved["replicate parameters"] += (n - 1) * self.param_bytes
        outs = in_threads(lambda k: self.replicas[k](xs[k]), range(n))  # 3. forward: (B/N, T, V) each
        gathered = torch.cat([o.detach() for o in outs]).requires_grad_()  # 4. gather: (B, T, V) on device 0
        moved["gather outputs"] += sum(tensor_bytes([o]) for o in outs[1:])
        loss = TinyGPT.loss(gathered, y)                               # the whole micro-batch's mean
        (loss * weight).backward()                                     # only as far as the gathered outputs
        grads = gathered.grad.split([o.size(0) for o in outs])         # 5. scatter: (B/N, T, V) each
        moved["scatter output gradients"] += sum(tensor_bytes([g]) for g in grads[1:])
        in_threads(lambda k: outs[k].backward(grads[k]), range(n))     # 6. backward in each replica
        with torch.no_grad():                                          # 7. reduce onto device 0
            for replica in self.replicas[1:]:
                for master, mine in zip(self.model.parameters(), replica.parameters(), strict=True):
                    if mine.grad is not None:
                        master.grad = mine.grad.clone() if master.grad is None else master.grad.add_(mine.grad)
        moved["reduce gradients"] += (n - 1) * self.param_bytes
        return loss.item()

    def device0_per_step(self) -> dict[str, int]:
        """Bytes through device 0, per step, averaged over the steps run so far: {transfer: bytes}."""
        steps = max(len(self.traffic), 1)
        return {name: sum(t[name] for t in self.traffic) // steps for name in TRANSFERS}
