"""Finding and signalling the processes of one launch, and never anybody else's.

Every process of a launch (torchrun, each rank, whatever a rank starts) inherits `PARTRAIN_RUN_ID=<fresh id>` in
its environment, so "the processes of this run" is a scan of /proc: it finds them whatever session or process group
they moved to and whoever their parent is now (an agent forked by `agent_server` writes its launch's environment
where /proc shows it: `take_environment`). A process that cleared its environment is still found while it
descends from one that did not; one that also left that ancestry (a double fork) is not, and only the run's
cgroup (`cgroup.py`, where the machine allows one) still holds it.

Signals are sent to single processes, never to a process group, so there is no PID 0, -1 or own group to hit by
mistake. Each goes through a pidfd opened *after* checking that the PID still has the start time the scan saw: a
process that exited and whose PID the kernel gave to someone else meanwhile is never signalled.

Linux only: where there is no /proc nothing is found, and the launcher falls back to stopping torchrun itself.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable

RUN_ENV = "PARTRAIN_RUN_ID"
LAUNCHER_ENV = "PARTRAIN_LAUNCHER"  # identity() of the process that called torchrun(), for the ranks' watchdogs
SUPPORTED = os.path.exists("/proc/self/stat")
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # clock ticks after boot: with the pid, unique for the machine's uptime
    session: int = -1


def read(pid: int) -> Proc | None:
    """The process `pid` now, or None if there is none or it has exited (a zombie: nothing left to signal)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the command name, in parentheses, may contain spaces
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid, int(fields[1]), int(fields[2]), int(fields[19]), int(fields[3]))


def identity(pid: int) -> str | None:
    """"pid:start", which names this very process even after its PID is reused (None without /proc)."""
    proc = read(pid)
    return None if proc is None else f"{proc.pid}:{proc.start}"


def is_running(ident: str) -> bool:
    pid, start = (int(part) for part in ident.split(":"))
    proc = read(pid)
    return proc is not None and proc.start == start


def _table() -> dict[int, Proc]:
    table = {}
    for name in os.listdir("/proc") if SUPPORTED else ():
        if name.isdigit() and (proc := read(int(name))) is not None:
            table[proc.pid] = proc
    return table


def _descendants(table: dict[int, Proc], roots: set[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _has_env(pid: int, entry: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return entry in f.read().split(b"\0")
    except OSError:  # another user's process, or gone
        return False


def run_members(run_id: str) -> list[Proc]:
    """Every live process of the run `run_id`, except the calling process."""
    table = _table()
    entry = f"{RUN_ENV}={run_id}".encode()
    marked = {pid for pid in table if _has_env(pid, entry)}
    return [table[pid] for pid in sorted(_descendants(table, marked)) if pid in table and pid != os.getpid()]


def leftovers_of(pid: int, keep: set[int] = frozenset()) -> list[Proc]:
    """What `pid` started and left running: its descendants and the members of the process group it leads."""
    table = _table()
    found = _descendants(table, {pid}) | {p.pid for p in table.values() if p.pgid == pid}
    return [table[p] for p in sorted(found - {pid, os.getpid(), *keep}) if p in table]


def children(pid: int) -> list[Proc]:
    """The live processes whose parent is `pid`."""
    return [p for p in _table().values() if p.ppid == pid]


def session_members(sid: int) -> list[Proc]:
    """Every live process of session `sid` or of process group `sid` (a child that changed its group but not its
    session is still found; one that started a session of its own is not), except the calling process."""
    return [p for p in _table().values() if sid in (p.session, p.pgid) and p.pid != os.getpid()]


def signal_each(procs: list[Proc], sig: int) -> None:
    for proc in procs:
        if proc.pid <= 1 or proc.pid == os.getpid():
            continue
        try:
            fd = os.pidfd_open(proc.pid)
        except ProcessLookupError:
            continue
        except OSError:  # a kernel without pidfds (before 5.3): check, then signal by PID
            fd = None
        try:
            now = read(proc.pid)
            if now is None or now.start != proc.start:
                continue  # it exited: that PID may be somebody else's by now
            if fd is None:
                os.kill(proc.pid, sig)
            else:
                signal.pidfd_send_signal(fd, sig)
        except (ProcessLookupError, PermissionError):
            pass
        finally:
            if fd is not None:
                os.close(fd)


def stop(find: Callable[[], list[Proc]], grace_s: float) -> None:
    """SIGTERM what `find()` returns, give it `grace_s` to exit, then SIGKILL what `find()` still returns. Found
    again each round: a process may have started another one in between."""
    signal_each(find(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and find():
        time.sleep(0.05)
    for _ in range(10):
        left = find()
        if not left:
            return
        signal_each(left, signal.SIGKILL)
        time.sleep(0.05)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG), and end now
    if `parent` is gone already. For the agent, netem's nodes and the grader's sandbox; a no-op off Linux."""
    if _set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent:
        os._exit(1)  # the launcher died before the line above: nobody is waiting for this run


def outlive_parent() -> None:
    """Undo a parent-death signal: a rank torchrun forked (which asks for SIGINT when torchrun dies) outlives it,
    as an exec'd one does, so that its watchdog is what stops the run (`launcher.rank`)."""
    _set_parent_death_signal(0)


def _set_parent_death_signal(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig); False off Linux, where the ranks' watchdogs are the only guard."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True


def take_environment(env: dict[str, str]) -> None:
    """Make `env` this process's environment, in `os.environ` and in the block /proc/PID/environ shows (a fork
    keeps its parent's; `agent_server` left room for a launch's). The block is no longer libc's once every
    variable has been set anew, so it can be written over (through /proc/self/mem, which a process may write)."""
    os.environ.clear()
    os.environ.update(env)
    with open("/proc/self/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (proc(5))
    block = b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
    if len(block) > end - start:
        raise OSError(f"the environment ({len(block)} bytes) does not fit the server's room ({end - start} bytes)")
    with open("/proc/self/mem", "r+b", buffering=0) as mem:
        mem.seek(start)
        mem.write(block + b"\0" * (end - start - len(block)))
