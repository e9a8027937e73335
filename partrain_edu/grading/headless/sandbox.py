"""Where a submission's code runs. With the grader as root on Linux: as the unprivileged user `partrain-grader`
(created with `useradd --system` when missing), inside fresh mount, PID, IPC and network namespaces
(jail.py) — it sees only a private working folder and a private /tmp, cannot see the submissions, the
grader's home or the repository (solutions/, .git), finds Python, the venv and the package read-only, reaches
no network but its own loopback, and dies with everything it started when the grader kills it. A probe checks
that this holds before any grading; otherwise (not root, no `unshare`, no namespaces) the grader falls back
to running submissions as its own user, each in a private folder and its own session, and says so:
`Isolation.summary` is printed and put in the --json report.
"""
from __future__ import annotations

import contextlib
import functools
import getpass
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import partrain_edu
from partrain_edu.launcher import processes

USER = "partrain-grader"
PACKAGE = Path(partrain_edu.__file__).resolve().parent
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")  # world-writable: notes between submissions
SCRATCH = ("/dev/shm",)  # of those, covered by one the sandbox user may write: multiprocessing's semaphores
UNSHARE = ["--mount", "--pid", "--ipc", "--net", "--fork", "--kill-child", "--mount-proc", "--propagation", "private"]
PROBE = """import json, os, sys
import partrain_edu
package, submission = sys.argv[1:3]
print(json.dumps({"uid": os.getuid(), "package_writable": os.access(package, os.W_OK)
                  or os.access(os.path.join(package, "__init__.py"), os.W_OK),
                  "submission_visible": os.path.exists(submission),
                  "reference_visible": os.path.exists(os.path.join(package, "theory", "grid.py"))}))
"""


@dataclass(frozen=True)
class Isolation:
    jailed: bool
    uid: int | None
    gid: int | None
    hide: tuple[str, ...]       # covered by an empty tmpfs in the jail
    readonly: tuple[str, ...]   # mounted back read-only: what a submission needs to run
    summary: str                # what was achieved, in words
    unshare: str = "unshare"
    cover: tuple[tuple[str, str], ...] = ()   # (view folder, package folder it covers): view.py

    @contextlib.contextmanager
    def folder(self) -> Iterator[Path]:
        """A private, empty working folder (with a tmp/ inside) for one sandboxed process; removed after."""
        root = Path(tempfile.mkdtemp(prefix="partrain_grade_"))
        try:
            root.chmod(0o711)  # the sandbox user may pass through to work/, not list what else is here
            work = root / "work"
            (work / "tmp").mkdir(parents=True)
            if self.uid is not None:
                for path in (work, work / "tmp"):
                    os.chown(path, self.uid, self.gid)
                    path.chmod(0o700)
            yield work
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def spawn(self, argv: list[str], work: Path) -> subprocess.Popen:
        """Start `argv` in the sandbox with `work` as its home and working folder; stdin, stdout and stderr
        are pipes (channel.py). Always end it with `stop`."""
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(work),
               "TMPDIR": str(work / "tmp"), "LANG": "C.UTF-8", "PYTHONNOUSERSITE": "1",
               "PYTHONDONTWRITEBYTECODE": "1", "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                 "start_new_session": True}
        if not self.jailed:
            return subprocess.Popen(argv, cwd=work, env=env, **pipes)
        env["GLOO_SOCKET_IFNAME"] = "lo"  # the only interface in the jail's network namespace
        spec = work.parent / "jail.json"  # root's, 0600: read by the jail before it drops to the sandbox user
        with open(os.open(spec, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump({"uid": self.uid, "gid": self.gid, "hide": list(self.hide), "readonly": list(self.readonly),
                       "writable": [str(work)], "cover": [list(c) for c in self.cover], "cwd": str(work),
                       "scratch": list(SCRATCH),
                       "argv": argv, "env": env}, f)
        jail = "partrain_edu.grading.headless.jail"
        command = [self.unshare, *UNSHARE, sys.executable, "-I", "-m", jail, str(spec)]
        return subprocess.Popen(command, cwd="/", env={"PATH": env["PATH"], "LANG": "C.UTF-8"},
                                preexec_fn=functools.partial(processes.die_with_parent, os.getpid()), **pipes)

    def stop(self, proc: subprocess.Popen) -> None:
        """Kill `proc` and everything it started; return once they are gone."""
        if not self.jailed:   # its session and process group; one that started a session of its own escapes
            processes.stop(lambda: processes.session_members(proc.pid), grace_s=0.0)
            proc.wait()
            return
        jail = processes.children(proc.pid)  # the namespace's PID 1, seen from here
        proc.kill()  # unshare's --kill-child kills the jail, and the kernel every process in its namespace...
        proc.wait()
        deadline = time.monotonic() + 10
        while any(processes.is_running(f"{p.pid}:{p.start}") for p in jail) and time.monotonic() < deadline:
            time.sleep(0.02)  # ...before the jail itself is gone: then nothing of the submission is left


def isolation_for(folder: Path, submission: Path) -> Isolation:
    """The strongest isolation this machine allows, after a probe that `submission` (one file in `folder`)
    is out of the sandbox's sight and the package out of its reach."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return _unjailed("the grader is not root")
    unshare = shutil.which("unshare")
    if unshare is None:
        return _unjailed("no `unshare` command (util-linux)")
    try:
        uid, gid = _sandbox_user()
    except (OSError, subprocess.CalledProcessError, ValueError) as err:
        detail = getattr(err, "stderr", "") or err
        return _unjailed(f"cannot create the user {USER}: {str(detail).strip()}")
    home = str(Path.home())
    repo = PACKAGE.parent if (PACKAGE.parent / "pyproject.toml").exists() else None  # a source checkout
    hide = [*PRIVATE_TMP, home, str(folder.resolve()), *([str(repo)] if repo else [])]
    readonly = [str(Path(p).resolve()) for p in (sys.base_prefix, sys.prefix, PACKAGE)]
    jailed = Isolation(True, uid, gid, tuple(dict.fromkeys(p for p in hide if p != "/")),
                       tuple(dict.fromkeys(readonly)),
                       f"sandbox: each notebook ran as user {USER} (uid {uid}) in its own mount, PID, IPC and "
                       f"network namespaces with a private folder and /tmp; the submissions, {home}"
                       f"{' and the repository ' + str(repo) if repo else ''} hidden; Python, the venv and the "
                       "package read-only, the course's implementations (theory, parallel, strategies, ...) "
                       "absent but for the exercises' helpers; no network; killed with everything it started "
                       "at the time limit", unshare, _view())
    problem = _probe(jailed, submission.resolve())
    return _unjailed(problem) if problem else jailed


def _view() -> tuple[tuple[str, str], ...]:
    """The view of the package the sandbox gets (view.py), written once per grading process, removed at exit."""
    import atexit

    from partrain_edu.grading.headless import view

    folder = Path(tempfile.mkdtemp(prefix="partrain_view_"))
    folder.chmod(0o755)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return tuple(view.build(folder))


def _sandbox_user() -> tuple[int, int]:
    import pwd  # Unix only, and only the root grader on Linux gets here

    try:
        entry = pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
                        "/usr/sbin/nologin", "--user-group", USER], check=True, capture_output=True, text=True)
        entry = pwd.getpwnam(USER)
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ValueError(f"the user {USER} has uid or gid 0: make it an unprivileged system user")
    return entry.pw_uid, entry.pw_gid


def _probe(jailed: Isolation, submission: Path) -> str | None:
    """None when the jail starts, runs as the sandbox user, cannot write the package and cannot see
    `submission`; else what went wrong."""
    with jailed.folder() as work:
        proc = jailed.spawn([sys.executable, "-I", "-c", PROBE, str(PACKAGE), str(submission)], work)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            jailed.stop(proc)
            return "the sandbox did not start within 120 s"
        jailed.stop(proc)
    try:
        seen = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return f"the sandbox could not run Python ({last})"
    if seen.get("uid") != jailed.uid:
        return f"the sandbox ran as uid {seen.get('uid')}, not {jailed.uid}"
    if seen.get("package_writable") or seen.get("submission_visible") or seen.get("reference_visible"):
        return "the sandbox could " + ("write the package" if seen.get("package_writable") else
                                       f"see {submission}" if seen.get("submission_visible") else
                                       "read the course's implementation")
    return None


def _unjailed(reason: str) -> Isolation:
    user = getpass.getuser()
    return Isolation(False, None, None, (), (), f"no sandbox ({reason}): each notebook ran as {user} in a private "
                     f"folder and its own session, killed at the time limit, but it could change anything {user} "
                     "can (the package, other submissions) and import the course's implementations; for a "
                     "sandbox run the grader as root on Linux, or in a container (README, 'Where it runs')")
