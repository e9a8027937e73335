"""The sandbox's first process: root, PID 1 of fresh mount, PID, IPC and network namespaces (started by
sandbox.py as `unshare --mount --pid --ipc --net --fork --kill-child --mount-proc --propagation private python -I
-m partrain_edu.grading.headless.jail SPEC`). It prepares the view of the file system and brings up loopback (the
ranks of a multi-rank check talk over it; nothing else is reachable), then runs the command as the unprivileged
sandbox user and exits with its status. The view: every folder in `hide` is covered by an empty tmpfs (the
submissions, the grader's home, the repository with solutions/ and .git, and the world-writable /tmp, /var/tmp,
/dev/shm, /run/lock — so submissions cannot leave files for each other; `scratch` ones, /dev/shm where torchrun's
forked ranks keep multiprocessing's semaphores, stay writable); the folders in `readonly` (Python, the
venv, the package) and `writable` (this run's private folder) are then mounted back where they were, the first
ones read-only, so a submission can neither change the grader nor read what it must not, whatever the file
permissions say. Last, each package folder in `cover` is covered read-only by the view of view.py: the course's
answers are in no file, module or cache the sandbox can reach, under any spelling of the import.

Staying PID 1 (instead of exec'ing the command) is what makes "kill everything it started" exact: when this
process dies — the command exited, or the grader killed `unshare`, whose --kill-child kills us — the kernel
kills every process left in the namespace, however it forked or detached.
"""
from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import socket
import struct
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
TMPFS_OPTIONS = "mode=0755,size=512m"
SCRATCH_OPTIONS = "mode=1777,size=64m"  # a `scratch` folder: empty, private to this jail, but writable by the user
MAX_PROCESSES = 2048  # per user (threads count): a fork bomb stops here; torch ranks use a few dozen
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [None if a is None else a.encode() for a in (source, target, fstype, data)]
    if _libc.mount(args[0], args[1], args[2], flags, args[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def prepare_view(hide: list[str], readonly: list[str], writable: list[str], cover: list | None = None,
                 scratch: list[str] | None = None) -> None:
    # Hold what must stay visible by file descriptor first: once a folder above it is covered, its path is
    # gone, but /proc/self/fd/N still names it, and binding that puts it back.
    kept = [(path, os.open(path, os.O_PATH | os.O_DIRECTORY), path in readonly) for path in [*readonly, *writable]]
    covers = [(os.open(src, os.O_PATH), dst) for src, dst in cover or ()]   # folders, and a few files
    covered: list[str] = []
    for path in sorted(hide, key=len):
        if any(path == c or path.startswith(c.rstrip("/") + "/") for c in covered) or not os.path.isdir(path):
            continue  # already inside a covered folder, or nothing to hide
        options = SCRATCH_OPTIONS if path in (scratch or ()) else TMPFS_OPTIONS
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
        covered.append(path)
    for path, fd, read_only in kept:
        os.makedirs(path, exist_ok=True)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        if read_only:
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for fd, path in covers:   # then the course's answers are covered by the view (view.py), read-only
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND)
        mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)


def loopback_up() -> None:
    """`ip link set lo up`, without needing iproute2: a fresh network namespace starts with lo down."""
    get_flags = 0x8913  # SIOCGIFFLAGS (linux/sockios.h)
    set_flags = 0x8914  # SIOCSIFFLAGS
    up = 0x1           # IFF_UP
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        name, flags, pad = struct.unpack("16sH14s", fcntl.ioctl(s, get_flags, struct.pack("16sH14s", b"lo", 0, b"")))
        fcntl.ioctl(s, set_flags, struct.pack("16sH14s", name, flags | up, pad))


def run_as(uid: int, gid: int, cwd: str, argv: list[str], env: dict[str, str]) -> int:
    child = os.fork()
    if child == 0:
        try:
            resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            os.umask(0o077)
            os.chdir(cwd)
            os.execve(argv[0], argv, env)
        except BaseException as exc:  # noqa: BLE001 — report why, never run the grader's code as root
            print(f"jail: cannot start {argv[0]} as uid {uid}: {exc}", file=sys.stderr)
        os._exit(127)
    for fd in (0, 1):  # only the command holds the channel: its death is the grader's end-of-file at once
        os.close(fd)
    while True:  # also reap orphans, which the namespace hands to PID 1
        pid, status = os.wait()
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    try:
        prepare_view(spec["hide"], spec["readonly"], spec["writable"], spec.get("cover"), spec.get("scratch"))
        loopback_up()
    except OSError as exc:
        print(f"jail: {exc}", file=sys.stderr)
        sys.exit(125)
    sys.exit(run_as(spec["uid"], spec["gid"], spec["cwd"], spec["argv"], spec["env"]))


if __name__ == "__main__":
    main()
