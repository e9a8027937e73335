"""benchmarks/gpu_check.py runs on a GPU machine only when one is lent; its --smoke mode runs the same code on
the CPU here, so the script cannot rot between loans, and its state bytes already meet the ZeRO formulas."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def test_the_gpu_check_runs_its_code_path_on_the_cpu():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    result = gpu_check.main(["--smoke"])
    for name, memory in result["memory"].items():
        held, predicted = memory["held"], memory["predicted"]
        assert memory["peak_allocated"] is None                       # the allocator's peak needs CUDA
        # fp32 + AdamW: 4 + 4 + 8 B per parameter, sharded over 2 ranks by ZeRO-3 (⌈Ψ/2⌉ each: ≤ 4 B padding);
        # Adam also keeps one 4-byte step counter per tensor, which the formula leaves out
        pad = 4 if name == "zero3" else 0
        assert 0 <= predicted[0] - held["params"] <= pad and 0 <= predicted[1] - held["grads"] <= pad, name
        assert 0 <= held["optimizer"] - predicted[2] + 2 * pad <= 4 * 200, (name, held, predicted)
    assert result["layer"]["real_s"] > 0 and result["layer"]["emulated_h100_s"] > 0
