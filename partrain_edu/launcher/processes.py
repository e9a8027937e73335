"""Finding and signalling the processes of one launch, and never anybody else's, through psutil.

A run's processes are those whose environment carries its `PARTRAIN_RUN_ID` (psutil's `environ()`), its workers and
ranks (named by identity, "pid:start": forked, they show their parent's environment; `nanny.roots`), and all their
descendants, whatever session or process group they moved to. A process that cleared its environment and left that
ancestry (a double fork) is found by none of these: only the run's cgroup (`cgroup.py`) still holds it.

Signals go to single processes, never to a group (no PID 0, -1 or own group to hit by mistake), each through a
`psutil.Process` made after checking that the PID still has the start time the scan saw; psutil checks it again
before it signals. psutil reads each platform's own tables (Linux, macOS, Windows, the BSDs).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import psutil

RUN_ENV = "PARTRAIN_RUN_ID"
LAUNCHER_ENV = "PARTRAIN_LAUNCHER"  # identity() of the process that called torchrun(), for the ranks' watchdogs
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int  # -1 where there are no process groups (Windows)
    start: int  # psutil's create time in 1/100 s: with the pid, unique for the machine's uptime
    session: int = -1


def _proc(p: psutil.Process) -> Proc | None:
    """`p` as a Proc, or None once it has exited (a zombie: nothing left to signal)."""
    try:
        with p.oneshot():
            if p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            ppid, start = p.ppid(), round(p.create_time() * 100)
    except _GONE:
        return None
    pgid = session = -1
    with contextlib.suppress(AttributeError, OSError):  # Windows has neither; some systems hide other sessions'
        pgid, session = os.getpgid(p.pid), os.getsid(p.pid)
    return Proc(p.pid, ppid, pgid, start, session)


def read(pid: int) -> Proc | None:
    """The process `pid` now, or None if there is none or it has exited."""
    try:
        return _proc(psutil.Process(pid))
    except _GONE:
        return None


def identity(pid: int) -> str | None:
    """"pid:start", which names this very process even after its PID is reused (None if it is gone)."""
    proc = read(pid)
    return None if proc is None else f"{proc.pid}:{proc.start}"


def named(ident: str) -> Proc:
    """The process an identity ("pid:start") names, as `signal_each` takes it (its parent and groups unknown)."""
    pid, start = map(int, ident.split(":"))
    return Proc(pid, -1, -1, start)


def is_running(ident: str) -> bool:
    proc = named(ident)
    now = read(proc.pid)
    return now is not None and now.start == proc.start


def _table() -> dict[int, Proc]:
    return {proc.pid: proc for p in psutil.process_iter() if (proc := _proc(p)) is not None}


def _descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found, todo = set(roots), list(roots)
    while todo:
        new = set(children.get(todo.pop(), ())) - found
        found |= new
        todo += new
    return found


def _has_env(pid: int, name: str, value: str) -> bool:
    try:
        return psutil.Process(pid).environ().get(name) == value
    except (*_GONE, OSError):  # another user's process, or gone
        return False


def _listed(table: dict[int, Proc], pids: set[int]) -> list[Proc]:
    """The live processes of `pids`, except the calling one, in PID order."""
    return [table[pid] for pid in sorted(pids) if pid in table and pid != os.getpid()]


def run_members(run_id: str, roots: Iterable[str] = ()) -> list[Proc]:
    """Every live process of the run `run_id`: marked by its environment, one of `roots` (identities, "pid:start":
    a forked process shows its parent's environment), or descending from either; except the calling process."""
    table = _table()
    marked = {pid for pid in table if _has_env(pid, RUN_ENV, run_id)}
    for proc in map(named, roots):
        if proc.pid in table and table[proc.pid].start == proc.start:
            marked.add(proc.pid)
    return _listed(table, _descendants(table, marked))


def leftovers_of(pid: int) -> list[Proc]:
    """What `pid` started and left running: its descendants and the members of the process group it leads."""
    table = _table()
    return _listed(table, _descendants(table, {pid}) - {pid} | {p.pid for p in table.values() if p.pgid == pid})


def children(pid: int) -> list[Proc]:
    """The live processes whose parent is `pid`."""
    return [p for p in _table().values() if p.ppid == pid]


def session_members(sid: int) -> list[Proc]:
    """Every live process of session `sid` or of process group `sid`, and every descendant of process `sid` (a
    child that started a session of its own is found while its parent lives), except the calling process."""
    table = _table()
    return _listed(table, _descendants(table, {sid}) | {p.pid for p in table.values() if sid in (p.session, p.pgid)})


def signal_each(procs: list[Proc], sig: int) -> None:
    for proc in procs:
        if proc.pid <= 1 or proc.pid == os.getpid():
            continue
        with contextlib.suppress(*_GONE):
            target = psutil.Process(proc.pid)
            if round(target.create_time() * 100) == proc.start:  # else it exited: that PID is somebody else's now
                target.send_signal(sig)  # psutil checks the identity again, just before it signals


def children_first(procs: list[Proc]) -> list[Proc]:
    """`procs`, the deepest descendants first: whoever signals a run from inside it (a rank's watchdog, while
    another rank's watchdog signals this one) has reached what the ranks started before it may die itself. The
    calling process is never in `procs`, but it is a link in its own children's chain."""
    parent = {p.pid: p.ppid for p in procs} | {os.getpid(): os.getppid()}

    def depth(pid: int) -> int:
        seen = 0
        while pid in parent and seen < len(parent):
            pid, seen = parent[pid], seen + 1
        return seen

    return sorted(procs, key=lambda p: -depth(p.pid))


def stop(find: Callable[[], list[Proc]], grace_s: float) -> None:
    """SIGTERM what `find()` returns, children first, give it `grace_s` to exit, then SIGKILL what `find()` still
    returns (at once with `grace_s=0`). Found again each round: a process may have started another one meanwhile."""
    if grace_s > 0:
        signal_each(children_first(find()), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and find():
        time.sleep(0.05)
    for _ in range(10):
        if not (left := find()):
            return
        signal_each(children_first(left), getattr(signal, "SIGKILL", signal.SIGTERM))  # Windows: one kill
        time.sleep(0.05)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG), and end now
    if `parent` is gone already. For netem's nodes and the grader's sandbox; a no-op off Linux."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(1)  # the launcher died before the line above: nobody is waiting for this run
