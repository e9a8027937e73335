"""One supervisor for the processes of a run: start them, read their output, stop all of them however it ends.

`supervise` starts N commands (one torchrun here; one per node under `netem`), each in a session of its own
(Ctrl-C in a terminal reaches only the launcher, which then stops the run itself), reads their merged output line
by line from one poll loop, and ends when every command has exited, when one failed and the others had
`failed_grace_s` to follow, when `timeout` has passed, or as soon as the ranks' call records show a collective
mismatch (`diagnose.findings.Watch`: such ranks would wait for ever). Then `stop` ends every process of the run,
found by its run id (`processes`) and its cgroup (`cgroup`), also after an interrupt or an error in the launcher.
It ends when the commands exit, not when their pipes close: a child a rank left running may hold a pipe open.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable

from partrain_edu.launcher import agent_server, cgroup, processes
from partrain_edu.launcher.diagnose import findings
from partrain_edu.launcher.diagnose.oneshot import TorchrunInterrupted, explain_mismatch
from partrain_edu.launcher.options import KILL_GRACE_S
from partrain_edu.launcher.output import Lines, Run


@dataclass
class Outcome:
    returncodes: list[int]           # one per command
    wall_s: float
    timed_out: bool
    mismatch: findings.Finding | None  # the collective mismatch that stopped the run, if one did


def supervise(commands: list[list[str]], env: dict[str, str], run: Run, timeout: float | None,
              takes: list[Callable[[str], None]], started: Callable[[int], None] | None = None,
              failed_grace_s: float = 0.0) -> Outcome:
    """Run `commands` (command i's lines go to `takes[i]`) until they end; `started(k)` is told each time the number
    of ranks whose process has started grows (`status_line.py`)."""
    start = time.perf_counter()
    run.cgroup = cgroup.create(run.run_id)  # where allowed: what escapes the scan stays in it (cgroup.py)
    env = {**env, cgroup.ENV: run.cgroup} if run.cgroup else env
    procs: list[subprocess.Popen | agent_server.Forked] = []
    readers: list[Lines] = []
    deadline = None if timeout is None else start + timeout
    timed_out = False
    mismatch = None
    watch = findings.Watch(run.run_dir, run.nproc)
    failed_at = None
    up = 0
    try:
        for command, take in zip(commands, takes, strict=True):
            procs.append(agent_server.popen(command, env))  # an agent is forked by a server that imported torch
            readers.append(Lines(procs[-1].stdout.fileno(), take))  # type: ignore[union-attr]
        while any(p.poll() is None for p in procs) and not timed_out and mismatch is None:
            now = time.perf_counter()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now  # under netem, the other node's ranks see "connection closed" soon after
            if failed_at is not None and now - failed_at > failed_grace_s:
                break
            left = None if deadline is None else deadline - now
            timed_out = left is not None and left <= 0
            for lines in readers:
                lines.read((0.1 if left is None else max(0.0, min(0.1, left))) / len(readers))
            # Ranks that wait in mismatched collectives wait for ever: stop them now. Unless the backend has aborted
            # one for it already (Gloo, on a size mismatch): torchrun then ends the run itself and names that rank,
            # however long a loaded machine takes to do so, so the message does not depend on load.
            found = watch.poll()
            mismatch = found if found is None or not any(map(explain_mismatch, run.texts().values())) else None
            if started is not None and up < run.nproc and (now_up := len(run.ranks_with(".pid"))) > up:
                up = now_up
                started(up)
        stop(procs, run)  # the commands have exited, time is up or the ranks can never finish: what runs must go
        for lines in readers:
            lines.drain(KILL_GRACE_S / len(readers))
    except KeyboardInterrupt:  # the stop button: one line for the learner, once every rank is gone
        stop(procs, run)
        raise TorchrunInterrupted(run.nproc, time.perf_counter() - start, run.texts()) from None
    except BaseException:  # SystemExit (a signal handler), an error in the launcher itself
        stop(procs, run)
        raise
    finally:
        for proc in procs:
            proc.stdout.close()  # type: ignore[union-attr]
    return Outcome([p.returncode for p in procs], time.perf_counter() - start, timed_out, mismatch)


def stop(procs: list[subprocess.Popen | agent_server.Forked], run: Any) -> None:
    """End the commands, every rank and everything they started: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()  # Popen never signals a PID it has already reaped
    processes.stop(lambda: processes.run_members(run.run_id), KILL_GRACE_S)
    cgroup.kill(run.cgroup)  # what the scan cannot find: a double-forked, setsid, env={} child
    for proc in procs:
        try:
            proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # one the scan may not signal (another user's): stop it directly
            proc.kill()
            proc.wait()
