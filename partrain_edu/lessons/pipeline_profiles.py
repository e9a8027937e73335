"""Run a pipeline schedule on real ranks for one measured step, and compare it with the simulator (notebook 06).

    real = profile_schedules(["pp-gpipe", "pp-1f1b"], microbatches=8)            # 4 CPU ranks, TinyGPT
    timed = profile_schedules(["pp-1f1b"], 8, device="emulated:a100", layers=8)  # seconds on the emulated clock
    print(same_as_simulated("pp-1f1b", real["pp-1f1b"], simulate(build_schedule("1f1b", 4, 8))))

Every rank runs `PROFILE` below: `strategies.pipeline.profile_step` runs the strategy's executor (the action
lists of `theory.schedules.build_schedule`) for a warm-up step and one measured step, and rank 0 publishes each
schedule's {"events", "peaks", "bubble"}. On `emulated:a100` the events are read from the emulated device's
clock, so their seconds mean what an A100 would take; on the CPU only their order and the memory are meaningful.
"""
from __future__ import annotations

PROFILE = '''
import sys
from partrain_edu import runtime
from partrain_edu.config import TrainConfig
from partrain_edu.models import GPTConfig
from partrain_edu.strategies.pipeline import profile_step

m, names, device, layers = int(sys.argv[1]), sys.argv[2].split(","), sys.argv[4], int(sys.argv[5])
ctx = runtime.init(device=device)
bounds = None if sys.argv[3] == "-" else [int(b) for b in sys.argv[3].split(",")]
runtime.publish("profiles", {name: profile_step(ctx, TrainConfig(name, nproc=ctx.world_size, microbatches=m,
                                                          model=GPTConfig(n_layer=layers)), bounds)
                             for name in names})
runtime.shutdown()
'''


def profile_schedules(names: list[str], microbatches: int, nproc: int = 4, device: str = "cpu", layers: int = 4,
                      bounds: list[int] | None = None, timeout: float | None = 900) -> dict[str, dict]:
    """{strategy: {"events", "peaks", "bubble"}} of one measured step of each pp-* strategy on `nproc` fresh
    ranks; `bounds` are the first layer of each stage after the first (None: `split_layers`' balanced split)."""
    from partrain_edu.launcher import torchrun

    cut = "-" if bounds is None else ",".join(str(b) for b in bounds)
    args = [str(microbatches), ",".join(names), cut, device, str(layers)]
    return torchrun(PROFILE, nproc=nproc, args=args, echo=None, timeout=timeout).published["profiles"]


def step_time(profile: dict) -> float:
    """The measured step: from the first action's start to the last action's end (s)."""
    return max(e["end"] for e in profile["events"]) - min(e["start"] for e in profile["events"])


def ran_order(profile: dict, stage: int) -> list[str]:
    """The actions rank `stage` ran, in order, as "F0", "B3", … (chunk suffix ".1" for interleaved chunks)."""
    return [f"{e['kind']}{e['microbatch']}" + (f".{e['chunk']}" if e.get("chunk") else "")
            for e in profile["events"] if e["stage"] == stage]


def same_as_simulated(name: str, profile: dict, simulated) -> str:
    """One line: what rank 0 ran, whether every rank ran its stage's simulated list in order, and the activations
    held per rank next to the simulator's."""
    schedule = simulated.schedule
    planned = [[f"{a.kind}{a.microbatch}" + (f".{a.chunk}" if a.chunk else "") for a in actions]
               for actions in schedule.actions]
    same = sum(ran_order(profile, s) == planned[s] for s in range(len(planned)))
    return (f"{name}: rank 0 ran {' '.join(ran_order(profile, 0)[:6])} …; ranks that ran the simulated list in "
            f"order: {same} of {len(planned)}; activations held {profile['peaks']}, "
            f"simulated {list(simulated.peak_activations)}")
