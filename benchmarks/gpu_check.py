"""What only a GPU can check: the memory model against CUDA's allocator, the emulated device against a real one.

    bash benchmarks/gpu_check.sh               (a few minutes on a machine with one or more GPUs)
    python benchmarks/gpu_check.py --smoke     (tiny shapes on the CPU: the same code path, no claims)

1. Memory. A TinyGPT of about 1B parameters (fp32 weights, AdamW: 4 + 4 + 8 = 16 B per parameter) trains two
   steps under the course's `ddp` and `zero3` on every GPU (NCCL). Printed per strategy: the model states the
   ZeRO formulas predict (`theory.memory.model_state_bytes`), the state tensors the rank holds (exact), and
   `torch.cuda.max_memory_allocated` — the peak, whose excess over the states is activations and transients.
2. Time. One GPT-3 XL layer (h = 2048, s = 2048, micro-batch 2) forward + backward in bf16 on GPU 0, against
   the emulated H100's 3 · (24·B·s·h² + 4·B·s²·h) / 989 TFLOP/s (`theory.hardware`; an H200 has the H100's
   compute). The ratio real / emulated is how far real kernels fall short of peak (1 / MFU of the layer).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from partrain_edu.launcher import torchrun

MEMORY = r"""
import json, sys, torch
from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.data import SyntheticTokens
from partrain_edu.models import GPTConfig
from partrain_edu.strategies import get_strategy, tensor_bytes
from partrain_edu.theory.memory import model_state_bytes

name, layers, hidden, seq, batch, vocab = sys.argv[1], *map(int, sys.argv[2:7])
ctx = runtime.init()
model = GPTConfig(vocab_size=vocab, seq_len=seq, n_layer=layers, n_embd=hidden, n_head=hidden // 128 or 1)
cfg = TrainConfig(strategy=name, nproc=ctx.world_size, steps=2, global_batch=batch * ctx.world_size, model=model)
strategy = get_strategy(name)(ctx, cfg)
data = SyntheticTokens(model.vocab_size, seq, seed=0)
for step in range(2):
    strategy.train_step(*data.global_batch(step, cfg.global_batch))
params = sum(p.numel() for p in strategy.new_model().parameters()) if ctx.rank == 0 else 0
held = {kind: tensor_bytes(ts) for kind, ts in strategy.state_tensors().items()}
peak = torch.cuda.max_memory_allocated() if ctx.device.type == "cuda" else None
if ctx.rank == 0:
    zero = 3 if name == "zero3" else 0
    runtime.publish("memory", {"params": params, "held": held, "peak_allocated": peak,
                               "predicted": model_state_bytes(params, dp=ctx.world_size, zero=zero,
                                                              precision="fp32", optimizer="adam")})
"""


def layer_time(hidden: int, seq: int, batch: int, device: str, repeats: int) -> dict:
    """Median seconds of one TinyGPT Block's forward + backward, next to the emulated H100's charge."""
    import torch

    from partrain_edu.models import Block, GPTConfig
    from partrain_edu.theory.hardware import DEVICES, ModelShape, layer_seconds

    block = Block(GPTConfig(vocab_size=8, seq_len=seq, n_layer=1, n_embd=hidden, n_head=max(1, hidden // 128)))
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    block = block.to(device=device, dtype=dtype)
    x = torch.randn(batch, seq, hidden, device=device, dtype=dtype, requires_grad=True)
    times = []
    for i in range(repeats + 2):                    # two warm-up runs (kernel selection, allocator)
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        block(x).sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
    emulated = 3 * layer_seconds(ModelShape("layer", 1, hidden, seq), batch, DEVICES["h100"])
    real = statistics.median(times)
    return {"real_s": real, "emulated_h100_s": emulated, "real_over_emulated": real / emulated}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (Gloo): the code path only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    if not args.smoke and gpus == 0:
        parser.exit(2, "gpu_check: no CUDA device here; run it on a GPU machine, or pass --smoke\n")
    nproc = 2 if args.smoke else gpus
    # ≈ 1.0B parameters: 16 layers of 12·h² with h = 2048, plus a 50304 × 2048 embedding
    shape = ["4", "64", "32", "2", "128"] if args.smoke else ["16", "2048", "1024", "4", "50304"]
    result = {"gpus": gpus, "nproc": nproc, "memory": {}}
    for name in ("ddp", "zero3"):
        done = torchrun(MEMORY, nproc=nproc, args=[name, *shape], timeout=900, echo=None)
        result["memory"][name] = done.published["memory"]
    device = "cpu" if args.smoke else "cuda"
    result["layer"] = layer_time(64 if args.smoke else 2048, 32 if args.smoke else 2048, 2, device,
                                 2 if args.smoke else 10)
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for name, m in result["memory"].items():
            predicted, held = sum(m["predicted"]), sum(m["held"].values())
            peak = "n/a on the CPU" if m["peak_allocated"] is None else f"{m['peak_allocated'] / 1e9:.2f} GB"
            print(f"{name}: {m['params'] / 1e6:,.1f}M params; states predicted {predicted / 1e6:,.2f} MB, "
                  f"held {held / 1e6:,.2f} MB; peak allocated {peak}")
        layer = result["layer"]
        print(f"one layer fwd+bwd: real {layer['real_s'] * 1e3:.2f} ms, emulated H100 "
              f"{layer['emulated_h100_s'] * 1e3:.2f} ms, real / emulated {layer['real_over_emulated']:.2f}")
    return result


if __name__ == "__main__":
    main()
