"""Start a launch's ranks with torch's own agent, the one torchrun runs, in a thread of the launching process.

    launch = Launch(run, "partrain_edu.launcher.rank", env)        # oneshot (warm.link: rank_loop)
    launch.poll() / launch.wait(s) / launch.returncode      (`supervise` stops it: `nanny.members`)

`torch.distributed.launcher.api.elastic_launch` (torchrun's own `launch_agent`) starts `nproc` workers
(`launcher.nanny`), each of which starts one rank, on the loopback rendezvous of `launcher.rendezvous`. The agent
runs in a daemon thread here, as accelerate's `notebook_launcher` runs it in the kernel: a launch costs no
torchrun process. Where the workers come from (torchrun's `--start-method`):
- Linux: CPython's forkserver, which imported torch and the rank wrappers once (PRELOAD), forks each worker in
  milliseconds; the worker forks its rank (`nanny`). The forkserver is one helper process per kernel.
- elsewhere (macOS, where forking a process that loaded system frameworks is unsafe), or when
  PARTRAIN_START_METHOD=spawn asks for it: each worker is exec'd afresh, as `torchrun script.py` does
  (`python -m partrain_edu.launcher.nanny`), and so is its rank, which imports torch itself: about 1–2 s more
  per launch.
The ranks inherit no handle of ours: the launcher finds them by their files (`nanny.members`) and stops them
through psutil; the agent then sees its workers end and returns. As with any multiprocessing forkserver, each
worker imports the launching script's top level again: a script (not a notebook) must put its launch under
`if __name__ == "__main__":`, and Python's own error says so when it does not.
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
AGENT_THREAD = "partrain-agent"
MONITOR_S = 0.05  # how often torch's agent looks at its workers (torchrun's --monitor-interval)


class _AgentLog(logging.Filter):
    """torch's agent logs to the notebook's stderr ("Failed to register signal handlers", a failed worker's exit
    code): from a launcher's agent thread those records go to that launch's `lines` instead."""

    lines: dict[int, list[str]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.threadName.startswith(AGENT_THREAD):
            return True
        self.lines.setdefault(record.thread, []).append(f"{record.levelname} {record.getMessage()}")
        return False


_prepared: list[bool] = []
_lock = threading.Lock()


def _prepare() -> None:
    """Once per process: keep the agent's log lines, and name what the forkserver imports (before it starts)."""
    with _lock:
        if _prepared:
            return
        log = _AgentLog()
        for name in ("torch", "torch.distributed"):  # where torch attaches its handlers (no propagation above)
            for handler in logging.getLogger(name).handlers:
                handler.addFilter(log)
        multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # used only where it forks
        _prepared.append(True)


def forks() -> bool:
    """Whether workers come from the forkserver (torchrun's `--start-method forkserver`), or start afresh."""
    method = os.environ.get(START_METHOD_ENV, "forkserver" if sys.platform.startswith("linux") else "spawn")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"{START_METHOD_ENV} must be forkserver or spawn, not {method!r}")
    return method == "forkserver"


class Launch:
    """One launch: `run.nproc` ranks running `wrapper` on `run.run_dir`, with `env` as their environment (torchrun's
    own variables added by the agent); what the agent logs goes to `run.launcher`. Quacks like the
    `subprocess.Popen` of a torchrun for `supervise`."""

    def __init__(self, run: Any, wrapper: str, env: dict[str, str]):
        forking = forks()
        _prepare()
        run_dir = Path(run.run_dir)
        self.run_dir = run_dir
        self.run_id = run.run_id
        self.returncode: int | None = None
        self.lines: list[str] = run.launcher
        nanny.write_env(run_dir, env)
        config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=run.nproc, run_id=run.run_id, max_restarts=0,
                              rdzv_backend=rendezvous.BACKEND, rdzv_endpoint="", monitor_interval=MONITOR_S,
                              start_method="forkserver" if forking else "spawn",
                              logs_specs=DefaultLogsSpecs(log_dir=str(run_dir / "torchelastic")))
        if forking:
            target, args = nanny.main, (str(run_dir), wrapper)
        else:
            target, args = sys.executable, ("-m", "partrain_edu.launcher.nanny", str(run_dir), wrapper)
        self.thread = threading.Thread(target=self._agent, args=(config, target, args), daemon=True,
                                       name=f"{AGENT_THREAD}-{run.run_id[:8]}")
        self.thread.start()

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
            self.lines[:0] = _AgentLog.lines.pop(threading.get_ident(), [])
            self.returncode = code

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self.thread.join(timeout)
        return self.returncode

