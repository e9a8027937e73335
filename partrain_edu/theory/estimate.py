"""One layout of one model on one device: memory per GPU, whether it fits, step time, throughput, MFU.

    partrain-edu estimate --model llama3-405b --device h100-sxm --tp 8 --pp 16 --dp 64 --zero 2 \\
        --global-batch 2048 --json

Memory is `layout_memory.fullest_stage`, time `step_time.step_time` with the device's fitted efficiency
(`calibration`). **MFU** counts the model's FLOPs per token (`ModelSpec.flops_per_token("none")`) over the GPUs'
peak; **HFU** the FLOPs the hardware ran, recompute included (Chowdhery et al. 2022, App. B) — Megatron-LM's
"achieved TFLOP/s" (Narayanan et al. 2021, eq. 3) are HFU × peak. The bubble is the fraction of the step the
busiest stage spends idle in the pipeline's fill and drain. **Caveats** (`caveats`, the JSON's "caveats"): where
the model's validation (`calibration_fit`, notebook 16) shows it off for runs like this one, and a layout above
`layout_memory.TIGHT` of the HBM.
"""
from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.theory.calibration import MEASURED, SAME_CHIP, Efficiency, terms
from partrain_edu.theory.hardware import canonical, device_named
from partrain_edu.theory.layout import Layout
from partrain_edu.theory.layout_memory import TIGHT, StageMemory, fullest_stage
from partrain_edu.theory.model_spec import ModelSpec
from partrain_edu.theory.step_time import step_time
from partrain_edu.units import format_bytes


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    layout: Layout
    device: str
    memory: StageMemory
    memory_capacity: float
    step_time_s: float
    breakdown: dict[str, float]
    fsdp_micro_batch_s: float = 0.0     # FSDP's collectives per micro-batch, hidden or not (`step_time`)

    @property
    def fits(self) -> bool:
        return self.memory.total <= self.memory_capacity

    @property
    def memory_fraction(self) -> float:
        return self.memory.total / self.memory_capacity

    @property
    def caveats(self) -> list[str]:
        """One line per known weakness of the model that applies to this estimate (notebook 16's numbers)."""
        lay, out = self.layout, []
        if self.memory_fraction > TIGHT:
            out.append(f"memory: {self.memory_fraction:.0%} of the GPU's, above {TIGHT:.0%}: real runs need room for "
                       "the allocator's spikes; this layout may not run")
        if SAME_CHIP.get(self.device, self.device) not in MEASURED:
            out.append("device: no measured matmul ceiling; the V100 takes the mean of the A100's and H100's")
        if lay.attention == "unfused":
            out.append("attention: unfused (2021-22 stacks); in validation the model was 12-22 % slow on Megatron-LM "
                       "2021's rows and 4-12 % fast on DeepSpeed's (GPT-NeoX, MT-NLG)")
        if self.dp_share > 0.25:
            out.append(f"FSDP traffic is {self.dp_share:.0%} of compute per micro-batch: what hides is charged the "
                       "overlap cost on its hand-set bound (NCCL's share of the SMs); llm-foundry's rows like this "
                       "were within -1 % to +6 %")
        return out

    @property
    def dp_share(self) -> float:
        """FSDP's per-micro-batch collectives over one micro-batch's compute (0 without FSDP)."""
        per_micro_batch = self.breakdown.get("compute", 0.0) / self.layout.microbatches
        return self.fsdp_micro_batch_s / per_micro_batch if per_micro_batch else 0.0

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.layout.batch * self.model.seq / self.step_time_s / self.layout.gpus

    @property
    def tflops_per_gpu(self) -> float:
        """Model FLOP/s per GPU, in TFLOP/s."""
        return self.model.flops_per_token("none") * self.tokens_per_s_per_gpu / 1e12

    @property
    def hfu_tflops_per_gpu(self) -> float:
        return self.model.flops_per_token(self.layout.recompute) * self.tokens_per_s_per_gpu / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu * 1e12 / device_named(self.device).peak_flops

    @property
    def hfu(self) -> float:
        return self.hfu_tflops_per_gpu * 1e12 / device_named(self.device).peak_flops

    @property
    def bubble(self) -> float:
        return self.breakdown["bubble"] / self.step_time_s

    def to_dict(self) -> dict:
        lay = self.layout
        return {"model": self.model.name, "device": self.device, "gpus": lay.gpus,
                "layout": {"tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "dp": lay.dp, "cp": lay.cp, "ep": lay.ep,
                           "zero": lay.zero, "micro_batch": lay.micro_batch, "global_batch": lay.batch,
                           "microbatches": lay.microbatches, "recompute": lay.recompute,
                           "schedule": lay.pipeline_schedule},
                "memory_bytes_per_gpu": round(self.memory.total), "memory": self.memory.to_dict(),
                "fits": self.fits, "memory_fraction": round(self.memory_fraction, 4), "caveats": self.caveats,
                "bubble": round(self.bubble, 4), "step_time_s": self.step_time_s,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "tflops_per_gpu": self.tflops_per_gpu,
                "mfu": round(self.mfu, 4), "hfu": round(self.hfu, 4),
                "breakdown": {k: v for k, v in self.breakdown.items()}}

    def table(self) -> str:
        lay, mem = self.layout, self.memory
        parts = ", ".join(f"{k} {v:.3g} s" for k, v in self.breakdown.items() if v)
        return "\n".join([
            f"{self.model.name} on {lay.gpus} × {device_named(self.device).name}: tp {lay.tp} pp {lay.pp}"
            + (f" (vpp {lay.vpp})" if lay.vpp > 1 else "") + f" cp {lay.cp} ep {lay.ep} dp {lay.dp}, ZeRO-{lay.zero},"
            f" {lay.microbatches} micro-batches of {lay.micro_batch}, recompute {lay.recompute}",
            f"  memory on the fullest GPU (stage {mem.stage}): {format_bytes(mem.total)} of "
            f"{format_bytes(self.memory_capacity)} — {'fits' if self.fits else 'does NOT fit'}",
            f"  step {self.step_time_s:.3g} s: {parts}",
            f"  {self.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, {self.tflops_per_gpu:.0f} TFLOP/s per GPU, "
            f"MFU {self.mfu:.1%} (HFU {self.hfu:.1%}), bubble {self.bubble:.1%}"]
            + [f"  caveat: {c}" for c in self.caveats])


def estimate(model: ModelSpec, layout: Layout, device: str, eff: Efficiency | None = None,
             memory_bytes: float | None = None) -> Estimate:
    """Memory, fit and step time of `layout` for `model` on GPUs of preset `device` (one-line errors);
    `memory_bytes` replaces the device's HBM size (a planner asked about 40 GB GPUs)."""
    hw = device_named(device)
    layout.check(model)
    timed = step_time(model, layout, device, eff or terms(canonical(device)))
    return Estimate(model, layout, canonical(device), fullest_stage(model, layout), memory_bytes or hw.memory_bytes,
                    timed.seconds, timed.breakdown, timed.fsdp_micro_batch_s)
