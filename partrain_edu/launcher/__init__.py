"""The launcher: start N ranks, carry their output, stop them, say what went wrong. One folder per process role.

| module / folder   | process     | what it does                                                                   |
|-------------------|-------------|--------------------------------------------------------------------------------|
| `oneshot`         | caller      | `torchrun(code, nproc)`: one run on fresh ranks (the `%%torchrun` magic's)       |
| `supervise`       | caller      | start the run's commands, read their lines, stop every process however it ends |
| `options`, `output` | caller    | limits, the ranks' environment; `[rank k]` lines, `Run`, `TorchrunResult`        |
| `processes`, `cgroup` | caller  | find every process of a run (psutil, PID-reuse safe), kill it; the run's cgroup |
| `agent`           | torchrun    | torchrun, forking the ranks from itself and dying with its caller               |
| `torchrun_main`   | torchrun    | torchrun's `main`; each failed rank's exit code saved from `ChildFailedError`    |
| `agent_server`    | caller/own  | one process that imported torch and forks each launch's agent (~10 ms, not 2 s) |
| `rank`, `call_records` | each rank | the wrapper every one-shot rank runs; the collective each rank is in, on disk |
| `status_line`     | caller      | "starting 4 ranks… 8 s (2 of 4 up)" while a cell waits                           |
| `warm/`           | both        | `%dist`: ranks kept between cells (`Pool`, its link, the ranks' loop)            |
| `diagnose/`       | caller      | why a run failed, in one error naming the rank (one-shot, warm, call records)   |

    from partrain_edu.launcher import torchrun
    result = torchrun("import torch.distributed as dist; ...", nproc=4, timeout=60)
"""
import importlib

_EXPORTS = {
    "torchrun": "oneshot", "call_with_timeout": "oneshot", "TorchrunResult": "output",
    "DEFAULT_RUN_TIMEOUT_S": "options", "check_timeout": "options", "check_arguments": "options",
    "TorchrunError": "diagnose.oneshot", "TorchrunInterrupted": "diagnose.oneshot",
    "Pool": "warm.pool", "DistError": "diagnose.warm", "DistInterrupted": "diagnose.warm",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    # Lazy: the agent and a rank's wrapper (`launcher.rank`) import this package first and must not pay for the
    # caller's side.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'partrain_edu.launcher' has no attribute {name!r}")
    return getattr(importlib.import_module(f"partrain_edu.launcher.{_EXPORTS[name]}"), name)
