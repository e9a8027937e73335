"""What each rank runs under the launcher: the user's script, with its output labelled and its error kept.

    python -m partrain_edu.launcher.agent ... --run-path --start-method=fork .../launcher/rank.py RUN_DIR  (oneshot)

RUN_DIR/argv.json holds what to run: ["script.py", args...] or ["--module", "package.module", args...].

Four small jobs, so that the notebook can show one clear story and nothing outlives the launch:
1. every line this rank writes to stdout or stderr is prefixed `[rank k] ` (the launcher sorts the merged stream by
   that prefix), whoever writes it: `print`, `os.write(1, ...)`, C code, a child process. File descriptors 1 and 2
   are a pipe to a small labelling process forked first, which also passes on the last lines of a rank that crashes;
2. an uncaught exception is written, with a traceback trimmed to the user's frames, to RUN_DIR/rank{k}.error
   (and a clean finish to RUN_DIR/rank{k}.done, so a timeout can name the ranks that never got there);
   RUN_DIR/rank{k}.pid says the rank started, RUN_DIR/rank{k}.calls which collective it is in (`call_records`);
3. when the script ends, whatever it started and left running is killed: its descendants, and the members of its
   process group (torchrun starts each rank in a session of its own, which its children share);
4. if the process that called `torchrun()` dies (a closed terminal, a killed kernel), a watchdog thread kills the
   whole run, then the run's cgroup where there is one (`cgroup`), this rank last, and removes RUN_DIR.
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import runpy
import select
import shutil
import signal
import sys
import threading
import time
import traceback
from typing import Callable

from partrain_edu.launcher import call_records, cgroup, processes

WATCH_S = 0.5  # how often the watchdog looks at the launcher
LONGEST_LINE = 1 << 20  # a "line" that never ends is passed on in pieces of this size


def _start_labeller(rank: int) -> int:
    """Fork the labelling process and point fds 1 and 2 at it; return its pid. Call before any thread starts."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(write_end)
        # torchrun stops a failed run with SIGTERM to each rank's process group: stay to pass on the rank's last
        # lines; the pipe's end (every writer gone) ends this process.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _label(read_end, f"[rank {rank}] ".encode())
        os._exit(0)
    os.close(read_end)
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)
    for stream in (sys.stdout, sys.stderr):  # an odd character must never cost the rank its life
        stream.reconfigure(errors="backslashreplace")
    return pid


def _label(read_end: int, prefix: bytes) -> None:
    pending = b""
    while chunk := os.read(read_end, 1 << 16):
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > LONGEST_LINE:
            lines.append(pending)
            pending = b""
        _write_lines(prefix, lines)
    _write_lines(prefix, [pending] if pending else [])


def _write_lines(prefix: bytes, lines: list[bytes]) -> None:
    """Whole lines, in writes of at most PIPE_BUF bytes where the lines allow: every rank writes into the same pipe
    to the launcher, and such writes never interleave with another rank's mid-line."""
    batch = b""
    for line in lines:
        entry = prefix + line + b"\n"
        if batch and len(batch) + len(entry) > select.PIPE_BUF:
            _write_all(batch)
            batch = b""
        batch += entry
    if batch:
        _write_all(batch)


def _write_all(data: bytes) -> None:
    try:
        while data:
            data = data[os.write(1, data):]
    except OSError:  # the launcher is gone: nobody to tell
        os._exit(0)


def _watch_launcher(run_dir: str) -> None:
    launcher, run_id = os.environ.get(processes.LAUNCHER_ENV), os.environ.get(processes.RUN_ENV)
    if not launcher or not run_id:
        return  # not started by partrain_edu.launcher.oneshot

    def watch() -> None:
        while processes.is_running(launcher):
            time.sleep(WATCH_S)
        # First the launcher's temporary folder (nobody else will remove it): the ranks' watchdogs race, and each
        # reaches the killing below only after removing it. Then the run's cgroup, at once, before the scan: the
        # watchdogs wake together, and each one's scan kills the other ranks, whose watchdogs may not have got
        # that far (a daemon only the cgroup holds would outlive them all).
        shutil.rmtree(run_dir, ignore_errors=True)
        cgroup.kill_from_inside(os.environ.get(cgroup.ENV))  # what escaped the scan, and the other ranks
        processes.stop(lambda: processes.run_members(run_id), grace_s=0.0)  # torchrun, every rank, what they started
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="partrain-watchdog", daemon=True).start()


def _finish(labeller: int) -> None:
    """Kill what the script left running, then let the labeller pass on the last output (at most 2 s)."""
    sys.stdout.flush(), sys.stderr.flush()
    processes.stop(lambda: processes.leftovers_of(os.getpid(), keep={labeller}), grace_s=0.5)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    deadline = time.monotonic() + 2.0
    try:
        while os.waitpid(labeller, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:  # something we could not kill still holds the pipe
                os.kill(labeller, signal.SIGKILL)
                os.waitpid(labeller, 0)
                return
            time.sleep(0.01)
    except ChildProcessError:  # the script reaped it already (os.wait())
        pass


def _user_traceback(exc: BaseException, skip: tuple[str, ...] = ()) -> str:
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
    rank = int(os.environ.get("RANK", 0))
    labeller = _start_labeller(rank)
    _watch_launcher(run_dir)
    pid_file = os.path.join(run_dir, f"rank{rank}.pid")
    with open(pid_file + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(pid_file + ".tmp", pid_file)  # the launcher never sees a half-written file
    call_records.record(run_dir, rank)
    try:
        return _run(run_dir, rank)
    finally:
        _finish(labeller)


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
        # Objects the script left behind (a DDP model, a P2POp, a subgroup) keep their process group and its
        # Gloo threads alive past destroy_process_group; free them first (see _exit below).
        namespace.clear()
        gc.collect()
    except SystemExit as exit_:  # sys.exit(): a clean exit when its code is 0 or None
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code:
            _write_error(run_dir, rank, f"SystemExit: {exit_.code}\n", timed_out=False)
            return code
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the notebook
        from partrain_edu.runtime import TIMEOUT_HINT, is_timeout_error

        text = _user_traceback(exc)
        timed_out = is_timeout_error(exc)
        if timed_out:
            text += f"\n{TIMEOUT_HINT}\n"
        _write_error(run_dir, rank, text, timed_out)
        sys.stderr.write(text)
        return 1
    _destroy_process_group()
    open(os.path.join(run_dir, f"rank{rank}.done"), "w").close()  # finished: not among the stuck ones
    return 0


def _destroy_process_group() -> None:
    """A script that leaves its process group alive can make Gloo abort at interpreter exit
    ("terminate called without an active exception"); tear it down for the learner."""
    dist = sys.modules.get("torch.distributed")  # a script that never imported it has no group (nor pays 2 s)
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _write_error(run_dir: str, rank: int, text: str, timed_out: bool) -> None:
    record = {"rank": rank, "time": time.time(), "traceback": text, "timed_out": timed_out}
    path = os.path.join(run_dir, f"rank{rank}.error")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)  # whole or not at all: torchrun may kill this rank mid-write


def run_as_worker(main: Callable[[list[str]], int]) -> None:
    """Run `main(sys.argv[1:])` in a worker torchrun forked (`agent.rank_target`) as in a fresh process: torchrun's
    signal handlers, fault handler and parent-death signal undone (the watchdog, not torchrun's death, ends a
    rank), a session of its own (as torchrun gives an exec'd rank). A failure exits at once; success returns:
    torchrun waits for the worker's return value. No interpreter teardown either way: it can abort while Gloo's
    threads finish."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if not (os.environ.get("PYTHONFAULTHANDLER") or "faulthandler" in sys._xoptions):
        faulthandler.disable()  # torchrun's error handler turned it on: a crash would print every thread's stack
    processes.outlive_parent()
    os.setsid()
    code = main(sys.argv[1:])
    if code:
        os._exit(code)


if __name__ == "__main__":
    run_as_worker(main)
