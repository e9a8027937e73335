"""One supervisor for the processes of a run: start them, read their output, stop all of them however it ends.

`supervise` starts the run (`start(env)`: a `start.Launch`; under `netem`, a torchrun per node), reads the ranks'
output files (`output.Tail`), and ends when every launch has ended, when one failed and the others had
`failed_grace_s` to follow, at `timeout`, or once the call records show a collective mismatch (`findings.Watch`:
those ranks would wait for ever). Then `stop` ends every process of the run, found by its files and run id
(`nanny.members`) and its cgroup, also after an interrupt or an error in the launcher.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from typing import Any, Callable

from partrain_edu.launcher import cgroup, nanny, processes
from partrain_edu.launcher.diagnose import findings
from partrain_edu.launcher.diagnose.oneshot import TorchrunInterrupted, explain_mismatch
from partrain_edu.launcher.options import KILL_GRACE_S
from partrain_edu.launcher.output import Run, Tail

POLL_S = 0.05


@dataclass
class Outcome:
    returncodes: list[int]           # one per launch
    wall_s: float
    timed_out: bool
    mismatch: findings.Finding | None  # the collective mismatch that stopped the run, if one did


def supervise(start: Callable[[dict[str, str]], list[Any]], env: dict[str, str], run: Run, timeout: float | None,
              started: Callable[[int], None] | None = None, failed_grace_s: float = 0.0) -> Outcome:
    """Run what `start(env)` starts (with `poll`, `wait` and `returncode`, as `subprocess.Popen`) until it ends;
    `started(k)`: k ranks have started (`status_line`)."""
    begin = time.perf_counter()
    run.cgroup = cgroup.create(run.run_id)  # where allowed: what escapes the scan stays in it (cgroup.py)
    env = {**env, cgroup.ENV: run.cgroup} if run.cgroup else env
    tail = Tail(run.run_dir, run.take)
    deadline = None if timeout is None else begin + timeout
    timed_out = False
    mismatch = None
    watch = findings.Watch(run.run_dir, run.nproc)
    failed_at = None
    up = 0
    procs: list[Any] = []
    try:
        procs = start(env)
        while any(p.poll() is None for p in procs) and not timed_out and mismatch is None:
            now = time.perf_counter()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now  # under netem, the other node's ranks see "connection closed" soon after
            if failed_at is not None and now - failed_at > failed_grace_s:
                break
            timed_out = deadline is not None and now >= deadline
            tail.read()
            # Ranks that wait in mismatched collectives wait for ever: stop them now. Unless the backend has aborted
            # one for it already (Gloo, on a size mismatch): the run then ends by itself, naming that rank,
            # however long a loaded machine takes to do so, so the message does not depend on load.
            found = watch.poll()
            mismatch = found if found is None or not any(map(explain_mismatch, run.texts().values())) else None
            if started is not None and up < run.nproc and (now_up := len(run.ranks_with(".pid"))) > up:
                up = now_up
                started(up)
            time.sleep(POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - now)))
        stop(procs, run)  # the launches have ended, time is up or the ranks can never finish: what runs must go
    except KeyboardInterrupt:  # the stop button: one line for the learner, once every rank is gone
        stop(procs, run)
        tail.close()
        raise TorchrunInterrupted(f"interrupted: every rank was stopped ({run.nproc} ranks, "
                                  f"{time.perf_counter() - begin:.1f} s)", run.texts()) from None
    except BaseException:  # SystemExit (a signal handler), an error in the launcher itself
        stop(procs, run)
        raise
    finally:
        tail.close()
    return Outcome([p.returncode for p in procs], time.perf_counter() - begin, timed_out, mismatch)


def stop(procs: list[Any], run: Any) -> None:
    """End the launches, every rank and everything they started: SIGTERM, then SIGKILL after KILL_GRACE_S."""
    for proc in procs:
        if isinstance(proc, subprocess.Popen) and proc.poll() is None:
            proc.terminate()  # a node's torchrun (netem); Popen never signals a PID it has already reaped
    processes.stop(lambda: nanny.members(run.run_dir, run.run_id), KILL_GRACE_S)
    cgroup.kill(run.cgroup)  # what the scan cannot find: a double-forked, setsid, env={} child
    for proc in procs:
        try:
            proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:  # one the scan may not signal (another user's): stop it directly
            proc.kill()
            proc.wait()
