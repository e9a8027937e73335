"""The launcher: start N ranks, carry their output, stop them, say what went wrong. One folder per process role.

| module / folder   | process     | what it does                                                                   |
|-------------------|-------------|--------------------------------------------------------------------------------|
| `oneshot`         | caller      | `torchrun(code, nproc)`: one run on fresh ranks (the `%%torchrun` magic's)       |
| `start`           | caller      | torch's agent (`elastic_launch`, what torchrun runs) in a thread; the forkserver |
| `rendezvous`      | caller      | the agent's rendezvous: a store that listens on 127.0.0.1 only                   |
| `supervise`       | caller      | start a run, read its output, stop every process however it ends                |
| `options`, `output` | caller    | limits, the ranks' environment; the per-rank output files, `Run`, `TorchrunResult` |
| `processes`, `cgroup` | caller  | find every process of a run (psutil, PID-reuse safe), kill it; the run's cgroup |
| `nanny`           | each worker | starts its rank, points its output at a file, keeps its exit code              |
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
    # Lazy: a rank's worker and wrapper (`launcher.nanny`, `launcher.rank`) import this package first and must not
    # pay for the caller's side.
    if name not in _EXPORTS:
        raise AttributeError(f"module 'partrain_edu.launcher' has no attribute {name!r}")
    return getattr(importlib.import_module(f"partrain_edu.launcher.{_EXPORTS[name]}"), name)
