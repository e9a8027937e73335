"""Finding and signalling the processes of one launch, and never anybody else's, through psutil.

Every process a rank starts inherits `PARTRAIN_RUN_ID=<fresh id>` in its environment, so "the processes of this
run" are those whose environment says so (psutil's `Process.environ()`), the run's workers and ranks themselves
(named by identity: forked, they show their parent's environment; `nanny.roots`), and all their descendants:
found whatever session or process group they moved to. A process that cleared its environment is still found
while it descends from one of these; one that also left that ancestry (a double fork) is not, and only the run's
cgroup (`cgroup.py`, where the machine allows one) still holds it.

Signals are sent to single processes, never to a process group, so there is no PID 0, -1 or own group to hit by
mistake. Each goes through a `psutil.Process` made *after* checking that the PID still has the start time the
scan saw, and psutil checks it again before it signals: a process that exited and whose PID went to someone else
meanwhile is never signalled. psutil reads each platform's own tables (Linux, macOS, Windows, the BSDs).
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
_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, ProcessLookupError)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int  # psutil's create time in 1/100 s: with the pid, unique for the machine's uptime
    session: int = -1


def _group_and_session(pid: int) -> tuple[int, int]:
    if not hasattr(os, "getsid"):   # Windows has neither
        return -1, -1
    try:
        return os.getpgid(pid), os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return -1, -1


def _proc(p: psutil.Process) -> Proc | None:
    """`p` as a Proc, or None once it has exited (a zombie: nothing left to signal)."""
    try:
        with p.oneshot():
            if p.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
                return None
            ppid = p.ppid()
            start = round(p.create_time() * 100)
    except (*_GONE, psutil.AccessDenied):
        return None
    pgid, session = _group_and_session(p.pid)
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


def is_running(ident: str) -> bool:
    pid, start = (int(part) for part in ident.split(":"))
    proc = read(pid)
    return proc is not None and proc.start == start


def _table() -> dict[int, Proc]:
    return {proc.pid: proc for p in psutil.process_iter() if (proc := _proc(p)) is not None}


def _descendants(table: dict[int, Proc], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = set(roots)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _has_env(pid: int, name: str, value: str) -> bool:
    try:
        return psutil.Process(pid).environ().get(name) == value
    except (*_GONE, psutil.AccessDenied, OSError):   # another user's process, or gone
        return False


def run_members(run_id: str, roots: Iterable[str] = ()) -> list[Proc]:
    """Every live process of the run `run_id`: marked by its environment, one of `roots` (identities, "pid:start":
    a forked process shows its parent's environment), or descending from either; except the calling process."""
    table = _table()
    marked = {pid for pid in table if _has_env(pid, RUN_ENV, run_id)}
    for ident in roots:
        pid, start = (int(part) for part in ident.split(":"))
        if pid in table and table[pid].start == start:
            marked.add(pid)
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
    """Every live process of session `sid` or of process group `sid`, and every descendant of process `sid` (a
    child that started a session of its own is found while its parent lives), except the calling process."""
    table = _table()
    found = _descendants(table, {sid}) | {p.pid for p in table.values() if sid in (p.session, p.pgid)}
    return [table[p] for p in sorted(found) if p in table and p != os.getpid()]


def signal_each(procs: list[Proc], sig: int) -> None:
    for proc in procs:
        if proc.pid <= 1 or proc.pid == os.getpid():
            continue
        with contextlib.suppress(*_GONE, psutil.AccessDenied):
            target = psutil.Process(proc.pid)
            if round(target.create_time() * 100) != proc.start:
                continue  # it exited: that PID is somebody else's by now
            target.send_signal(sig)   # psutil checks the identity again, just before it signals


def children_first(procs: list[Proc]) -> list[Proc]:
    """`procs`, the deepest descendants first: whoever signals a run from inside it (a rank's watchdog, while
    another rank's watchdog signals this one) has reached what the ranks started before it may die itself."""
    parent = {p.pid: p.ppid for p in procs}

    def depth(pid: int) -> int:
        seen = 0
        while pid in parent and seen < len(parent):
            pid = parent[pid]
            seen += 1
        return seen

    return sorted(procs, key=lambda p: -depth(p.pid))


def stop(find: Callable[[], list[Proc]], grace_s: float) -> None:
    """SIGTERM what `find()` returns, children first, give it `grace_s` to exit, then SIGKILL what `find()` still
    returns. Found again each round: a process may have started another one in between."""
    signal_each(children_first(find()), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and find():
        time.sleep(0.05)
    for _ in range(10):
        left = find()
        if not left:
            return
        signal_each(children_first(left), getattr(signal, "SIGKILL", signal.SIGTERM))   # Windows: one kill
        time.sleep(0.05)


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when the thread that started it ends (PR_SET_PDEATHSIG), and end now
    if `parent` is gone already. For netem's nodes and the grader's sandbox; a no-op off Linux."""
    if _set_parent_death_signal(signal.SIGKILL) and os.getppid() != parent:
        os._exit(1)  # the launcher died before the line above: nobody is waiting for this run


def _set_parent_death_signal(sig: int) -> bool:
    """prctl(PR_SET_PDEATHSIG, sig); False off Linux, where the ranks' watchdogs are the only guard."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return True
