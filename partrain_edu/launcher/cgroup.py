"""A cgroup per run, where the machine allows one: the containment that no fork, setsid or cleared environment
escapes (a process can leave a cgroup only by being moved out, which needs the rights of the one who made it).

    path = create(run_id)     # the launcher: a child of its own cgroup (cgroup v2), or None
    join(path)                # each rank's worker (`nanny`), before its rank starts: all it starts inherits it
    kill(path)                # the launcher, once the run is over: cgroup.kill, then the folder goes

`processes` finds a run's processes by their files, their PARTRAIN_RUN_ID or their ancestry; a rank's child that
double-forks, calls setsid and clears its environment has none of these, but it stays in the run's cgroup. Needs
a writable cgroup2 hierarchy with `cgroup.kill` (Linux 5.14), as root or in a delegated subtree; elsewhere
`create` returns None and only the scan stands (README's platform table says where).
"""
from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

ENV = "PARTRAIN_CGROUP"
PREFIX = "partrain-"


def _base() -> Path | None:
    """This process's own cgroup v2 folder, or None (no cgroup2 mount, no /proc)."""
    try:
        own = next(line[3:].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        mounts = [line.split(" - ")[0].split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                  if " - cgroup2 " in line]
    except (OSError, StopIteration, IndexError):
        return None
    for mount in mounts:
        folder = Path(mount, own.lstrip("/"))
        if folder.is_dir() and os.access(folder, os.W_OK):
            return folder
    return None


def create(run_id: str) -> str | None:
    """A fresh cgroup for the run `run_id`, or None where none can be made (or killed) here."""
    base = _base()
    if base is None:
        return None
    for stale in base.glob(PREFIX + "*"):   # left by a launcher that was killed: only old, empty ones go
        with contextlib.suppress(OSError):
            if time.time() - stale.stat().st_mtime > 600:
                stale.rmdir()
    folder = base / f"{PREFIX}{run_id}"
    try:
        folder.mkdir()
    except OSError:
        return None
    if not (folder / "cgroup.kill").exists():   # before Linux 5.14 there is no way to kill it whole
        with contextlib.suppress(OSError):
            folder.rmdir()
        return None
    return str(folder)


def join(path: str | None) -> None:
    """Move the calling process into `path` (its children to come inherit it); quietly nothing on failure."""
    if path:
        with contextlib.suppress(OSError):
            Path(path, "cgroup.procs").write_text("0")


def kill_from_inside(path: str | None) -> None:
    """A rank's watchdog, its launcher gone: step out into the parent cgroup, then `kill` the run's cgroup and
    remove it (the caller ends itself after). Unable to step out, it dies with the others, and a later
    `create` sweeps the empty folder."""
    if path:
        with contextlib.suppress(OSError):
            Path(path).parent.joinpath("cgroup.procs").write_text(str(os.getpid()))
        kill(path)


def _populated(folder: Path) -> bool:
    try:
        return "populated 1" in (folder / "cgroup.events").read_text()
    except OSError:
        return False


def kill(path: str | None, wait_s: float = 5.0) -> None:
    """SIGKILL every process still in `path`, wait until they are gone, remove the folder."""
    if not path:
        return
    folder = Path(path)
    if _populated(folder):
        with contextlib.suppress(OSError):
            (folder / "cgroup.kill").write_text("1")
        end = time.monotonic() + wait_s
        while _populated(folder) and time.monotonic() < end:
            time.sleep(0.01)
    with contextlib.suppress(OSError):
        folder.rmdir()
