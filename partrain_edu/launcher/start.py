"""Start a launch's ranks with torch's own agent, the one torchrun runs, in a thread of the launching process.

    launch = Launch(run, "partrain_edu.launcher.rank", env)        # oneshot (warm.link: rank_loop)
    launch.poll() / launch.wait(s) / launch.returncode      (`supervise` stops it: `nanny.members`)

`torch.distributed.launcher.api.elastic_launch` (torchrun's `launch_agent`) starts `nproc` workers (`nanny`), one
per rank, on the loopback rendezvous of `launcher.rendezvous`, in a daemon thread here, as accelerate's
`notebook_launcher` runs it in the kernel. Where the workers come from (torchrun's `--start-method`):
- Linux: CPython's forkserver (one helper process per kernel), which imported torch and the rank wrappers once
  (PRELOAD), forks each worker in milliseconds; the worker forks its rank.
- elsewhere (macOS: forking a process that loaded system frameworks is unsafe), or with PARTRAIN_START_METHOD=spawn:
  each worker is exec'd afresh, as `torchrun script.py` does, and so is its rank: about 1–2 s more per launch.
The ranks inherit no handle of ours: `supervise` finds them by their files and stops them through psutil; the agent
then sees its workers end. As with any forkserver, each worker imports the launching script's top level again: a
script (not a notebook) must launch under `if __name__ == "__main__":`, and Python's own error says so.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from partrain_edu.launcher import nanny, rendezvous

START_METHOD_ENV = "PARTRAIN_START_METHOD"  # "spawn": every worker and rank afresh, as off Linux (README)
# Imported once by the forkserver, before it forks any worker: torch, both wrappers a rank runs, and the compiler
# stack an optimizer's first step would load in every rank (`warmup`).
PRELOAD = ["partrain_edu.launcher.nanny", "partrain_edu.launcher.rank", "partrain_edu.launcher.warm.rank_loop",
           "partrain_edu.launcher.warmup"]
MONITOR_S = 0.05  # how often torch's agent looks at its workers (torchrun's --monitor-interval)


def forks() -> bool:
    """Whether workers come from the forkserver (torchrun's `--start-method forkserver`), or start afresh."""
    method = os.environ.get(START_METHOD_ENV, "forkserver" if sys.platform.startswith("linux") else "spawn")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"{START_METHOD_ENV} must be forkserver or spawn, not {method!r}")
    return method == "forkserver"


def _torch_handlers() -> list[logging.Handler]:
    # where torch attaches its log handlers (they do not propagate above)
    return [h for name in ("torch", "torch.distributed") for h in logging.getLogger(name).handlers]


class Launch(logging.Filter):
    """One launch: `run.nproc` ranks running `wrapper` on `run.run_dir`, with `env` as their environment (torchrun's
    own variables added by the agent). Quacks like the `subprocess.Popen` of a torchrun for `supervise`. What the
    agent logs from its thread ("Failed to register signal handlers", a failed worker's exit code) goes to
    `run.launcher`, for the error message, instead of the notebook's stderr."""

    def __init__(self, run: Any, wrapper: str, env: dict[str, str]):
        super().__init__()
        forking = forks()
        run_dir = Path(run.run_dir)
        self.returncode: int | None = None
        self.lines: list[str] = run.launcher
        self.run_id = run.run_id
        nanny.write_env(run_dir, env)
        self.store = rendezvous.open_store(run.run_id)  # the agent's, the ranks' and the launcher's
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=run.nproc, run_id=run.run_id, max_restarts=0,
                              rdzv_backend=rendezvous.BACKEND, rdzv_endpoint="", monitor_interval=MONITOR_S,
                              start_method="forkserver" if forking else "spawn",
                              logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "torchelastic")))
        if forking:
            multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # before it starts: once
            target, args = nanny.main, (str(run_dir), wrapper)
        else:
            target, args = sys.executable, ("-m", "partrain_edu.launcher.nanny", str(run_dir), wrapper)
        self.thread = threading.Thread(target=self._agent, args=(config, target, args), daemon=True,
                                       name=f"partrain-agent-{run.run_id[:8]}")
        for handler in _torch_handlers():
            handler.addFilter(self)
        self.thread.start()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread.ident:
            return True
        self.lines.append(f"{record.levelname} {record.getMessage()}")
        return False

    def _agent(self, config: LaunchConfig, target, args: tuple) -> None:
        code = 1
        try:
            elastic_launch(config, target)(*args)
            code = 0
        except ChildFailedError:  # a worker failed: its rank's exit code is in RUN_DIR (`nanny`)
            pass
        except BaseException as error:  # noqa: BLE001 - the launcher's error message shows it
            self.lines.append(f"torch's agent failed: {type(error).__name__}: {error}")
        finally:
            for handler in _torch_handlers():
                handler.removeFilter(self)
            rendezvous.close_store(self.run_id)
            self.returncode = code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self.thread.join(timeout)
        return self.returncode
