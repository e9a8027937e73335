"""What each rank runs under the launcher: the user's script, with its error kept and nothing left behind.

    main([RUN_DIR])            run by the rank's worker (`nanny.rank_main`), in a rank forked or exec'd for it

RUN_DIR/argv.json says what to run: ["script.py", args...] or ["--module", "package.module", args...]. Its output
goes to RUN_DIR/rank{k}.out already (`nanny`). Three jobs, so that the notebook tells one story and nothing
outlives the launch:
1. files: rank{k}.pid (started), .calls (its collective, `call_records`), .error (an uncaught exception, its
   traceback trimmed to the user's frames) or .done (a clean finish: a timeout names the ranks that never got there);
2. when the script ends, what it started and left running is killed (`finish`);
3. if the process that called `torchrun()` dies (a closed terminal, a killed kernel), a watchdog thread kills the
   run's cgroup, the whole run and this rank last, and removes RUN_DIR.
"""
from __future__ import annotations

import contextlib
import json
import os
import runpy
import shutil
import signal
import sys
import threading
import time
import traceback

from partrain_edu.launcher import call_records, cgroup, nanny, processes

WATCH_S = 0.5  # how often the watchdog looks at the launcher
_LEFT: list[dict] = []  # the finished scripts' namespaces, kept until the process ends (`_run` says why)


def _watch_launcher(run_dir: str) -> None:
    launcher, run_id = os.environ.get(processes.LAUNCHER_ENV), os.environ.get(processes.RUN_ENV)
    if not launcher or not run_id:
        return  # not started by partrain_edu.launcher

    own = [ident for ident in map(processes.identity, (os.getpid(), os.getppid())) if ident]  # this rank, its worker

    def watch() -> None:
        while processes.is_running(launcher):
            time.sleep(WATCH_S)
        roots = own + nanny.roots(run_dir)  # read before the folder that names the other workers goes
        # First the launcher's temporary folder (nobody else will remove it): the ranks' watchdogs race, and each
        # reaches the killing below only after removing it. Then the run's cgroup, at once, before the scan: the
        # watchdogs wake together, and each one's scan kills the other ranks, whose watchdogs may not have got
        # that far (a daemon only the cgroup holds would outlive them all).
        shutil.rmtree(run_dir, ignore_errors=True)
        cgroup.kill_from_inside(os.environ.get(cgroup.ENV))  # what escaped the scan, and the other ranks
        # Workers, ranks and their children, SIGKILLed deepest first (nobody is left to exit cleanly for): the
        # watchdogs kill each other's ranks, and whichever starts first has killed what every rank started.
        processes.stop(lambda: processes.run_members(run_id, roots), grace_s=0.0)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="partrain-watchdog", daemon=True).start()


def finish() -> None:
    """Kill what the script left running."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # the script may have closed or replaced it
            stream.flush()
    processes.stop(lambda: processes.leftovers_of(os.getpid()), grace_s=0.5)


def user_traceback(exc: BaseException, skip: tuple[str, ...] = ()) -> str:
    """The traceback without the launcher's, runpy's, torch's and `skip`'s frames: the learner's code is what
    failed (`skip`: the files of another wrapper, such as `launcher.warm.rank_loop`)."""
    import torch

    tb = traceback.TracebackException.from_exception(exc)
    skip = (__file__, call_records.__file__, "<frozen runpy>", runpy.__file__, *skip)
    torch_dir = os.path.dirname(torch.__file__) + os.sep  # torch's own wrappers say nothing to a learner
    frames = [f for f in tb.stack if f.filename not in skip]
    user_frames = [f for f in frames if not f.filename.startswith(torch_dir)]
    tb.stack = traceback.StackSummary.from_list(user_frames or frames)
    return "".join(tb.format())


def main(argv: list[str]) -> int:
    run_dir = argv[0]
    rank = started(run_dir)
    try:
        return _run(run_dir, rank)
    finally:
        finish()


def started(run_dir: str) -> int:
    """What every rank does first (`rank_loop` too): its watchdog, RUN_DIR/rank{k}.pid (its identity: the
    launcher's "started", and how the run's processes are found), its call records. Returns the rank."""
    rank = int(os.environ.get("RANK", 0))
    nanny.name(f"partrain rank {rank} of {os.environ.get('WORLD_SIZE', 1)}")
    _watch_launcher(run_dir)
    nanny.write_whole(run_dir, f"rank{rank}.pid", processes.identity(os.getpid()) or str(os.getpid()))
    call_records.record(run_dir, rank)
    return rank


def _run(run_dir: str, rank: int) -> int:
    with open(os.path.join(run_dir, "argv.json")) as f:
        rest = json.load(f)  # [script.py, args...] or ["--module", name, args...]
    try:
        if rest[0] == "--module":
            sys.argv = [rest[1], *rest[2:]]
            namespace = runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(rest)
            namespace = runpy.run_path(rest[0], run_name="__main__")
        # What the script left (a DDP model, its process group) is never freed: the rank ends with os._exit, which
        # skips every destructor. Freeing a DDP model whose Gloo group was destroyed can deadlock: the group's
        # destructor joins its worker thread holding the GIL, while that thread needs the GIL to drop a Python
        # object a finished collective kept (seen, with py-spy, in 10 of 40 runs of notebook 02's DDP cell).
        _LEFT.append(namespace)
    except SystemExit as exit_:  # sys.exit(): a clean exit when its code is 0 or None
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code:
            _write_error(run_dir, {"rank": rank, "time": time.time(), "traceback": f"SystemExit: {exit_.code}\n",
                                   "timed_out": False})
            return code
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the notebook
        error = {"rank": rank, **report(exc)}
        _write_error(run_dir, error)
        sys.stderr.write(error["traceback"])
        return 1
    open(os.path.join(run_dir, f"rank{rank}.done"), "w").close()  # finished: not among the stuck ones
    return 0


def report(exc: BaseException, skip: tuple[str, ...] = ()) -> dict:
    """A failure as `diagnose` reads it: the learner's traceback (`user_traceback`), whether it is a collective's
    timeout (then with runtime's hint), and when."""
    from partrain_edu.runtime import TIMEOUT_HINT, is_timeout_error

    timed_out = is_timeout_error(exc)
    text = user_traceback(exc, skip) + (f"\n{TIMEOUT_HINT}\n" if timed_out else "")
    return {"traceback": text, "timed_out": timed_out, "time": time.time()}


def _write_error(run_dir: str, error: dict) -> None:
    nanny.write_whole(run_dir, f"rank{error['rank']}.error", json.dumps(error))
