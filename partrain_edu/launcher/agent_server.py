"""One process that imported torch once and forks each launch's agent: ~10 ms per launch instead of ~2 s.

    python -m partrain_edu.launcher.agent_server LAUNCHER_PID [--preload=M,...]     (`popen` starts it once)

`popen(command, env)` is `subprocess.Popen` for `launcher.agent` command lines. The first launch of a kind
(its `--preload`, its interpreter-level variables, `INTERPRETER_ENV`) starts a server; each later one sends it
its arguments, environment and working directory over a socket pair of its own, with its output pipe. The
server forks a child that becomes the agent (`agent.main`) as an exec'd one would: a session of its own, the
pipe as stdout and stderr, the launch's environment — also in /proc/PID/environ, where `processes` finds a
run's members (`processes.take_environment` writes it over the room the server's own left). The server
reports the child's exit status on that launch's socket, signals it when asked (`Forked`, what `supervise`
holds) and SIGKILLs it when the socket closes; it ends when the launcher does, and its agents with it (their
parent-death signal). Where no server can be used, `popen` starts the agent afresh.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import traceback
from typing import IO

from partrain_edu.launcher import processes

MODULE = "partrain_edu.launcher.agent"
# Variables Python, torch or their libraries read when they start: a launch must share the server's (OpenMP reads
# OMP_NUM_THREADS when torch loads it). Anything else a launch sets applies to its agent alone.
INTERPRETER_ENV = re.compile(r"^(PYTHON|LD_|OMP_|MKL_|KMP_|GOMP_|OPENBLAS_|TORCH|PYTORCH_|CUDA|NCCL_|HIP|ROCM|"
                             r"MALLOC|GLIBC|LANG$|LC_|PATH$|HOME$|TMPDIR$)")
ROOM = "PARTRAIN_ENVIRONMENT_ROOM"  # the server's padding: room for a launch's environment in /proc/PID/environ
ROOM_BYTES = 1 << 16
START_S = 120.0  # the longest a launch waits for its agent to be forked before it starts one afresh
MAX_SERVERS = 3  # kinds of launch served at once by one launcher (each server holds ~300 MB)
FORKS_AGENTS = sys.platform.startswith("linux")  # elsewhere every agent starts afresh: the portable path

_servers: dict[tuple, _Server | None] = {}
_lock = threading.Lock()


def popen(command: list[str], env: dict[str, str]) -> subprocess.Popen | Forked:
    """Start `command` with `env`, its merged output in `.stdout`: forked by a server when it is an agent command
    (`agent.command`), else, or when no server can take it, with `subprocess.Popen`."""
    size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in env.items())
    if command[:3] == [sys.executable, "-m", MODULE] and FORKS_AGENTS and size < ROOM_BYTES:
        preload = next((arg for arg in command[4:5] if arg.startswith("--preload=")), "")
        key = (preload, tuple(sorted((k, v) for k, v in env.items() if INTERPRETER_ENV.match(k))))
        with _lock:
            server = _servers.pop(key, False)  # False: none yet; None: this kind could not be served here
            if server is False or (server is not None and not server.alive()):
                server = _Server(preload, dict(key[1]))
                serving = [k for k in _servers if _servers[k] is not None]
                for old in serving[:max(0, len(serving) + 1 - MAX_SERVERS)]:
                    _servers.pop(old).retire()  # the least recently used: it ends once its agents have
            _servers[key] = server  # the most recently used come last
        forked = None if server is None else server.fork(command[4:], env)
        if forked is not None:
            return forked
        if server is not None and not server.alive():
            _servers[key] = None  # it ended at once (it can fork no agent that looks exec'd here): never again
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


class _Server:
    """The launcher's side of one server: its process, and the socket each launch's own socket is sent over."""

    def __init__(self, preload: str, interpreter_env: dict[str, str]):
        env = {**interpreter_env, ROOM: "x" * ROOM_BYTES}  # nothing of any run's: each agent brings its own
        ours, theirs = socket.socketpair()
        self.socket, self.lock = ours, threading.Lock()
        command = [sys.executable, "-m", __name__, str(os.getpid()), *([preload] if preload else [])]
        self.proc = subprocess.Popen(command, env=env, stdin=theirs, stdout=subprocess.DEVNULL)
        theirs.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def retire(self) -> None:
        with self.lock:
            self.socket.close()

    def fork(self, argv: list[str], env: dict[str, str]) -> Forked | None:
        """`agent.main([server, *argv])` with `env` in a child of the server; None if the server could not."""
        mine, theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        channel, reply = _Channel(mine), None
        try:
            with self.lock:
                socket.send_fds(self.socket, [b"L"], [theirs.fileno(), out_w])
            _send(mine, {"argv": argv, "env": env, "cwd": os.getcwd()})
            if channel.ready(START_S):  # the first launch waits while the server imports torch
                reply = channel.read()
        except OSError:
            pass
        finally:  # on an interrupt too: closing our end has the server kill what it may have started
            theirs.close()
            os.close(out_w)
            if reply is None or "pid" not in reply:
                mine.close()
                os.close(out_r)
                reply = None
        return None if reply is None else Forked(reply["pid"], channel, os.fdopen(out_r, "rb", buffering=0))


class Forked:
    """A `subprocess.Popen` to `supervise`, for a forked agent: its exit status comes on the launch's socket, signals
    go through the server (which has not reaped it while it runs, so its PID still names it)."""

    def __init__(self, pid: int, channel: _Channel, stdout: IO[bytes]):
        self.pid, self.channel, self.stdout, self.returncode = pid, channel, stdout, None
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        while self.returncode is None:  # another thread (the warm pool's) may be waiting too
            try:
                ready = self.channel.ready(timeout)
            except (OSError, ValueError):  # that thread read the status and closed the socket meanwhile
                ready = True
            if not ready:
                raise subprocess.TimeoutExpired(MODULE, timeout)
            with self.lock:
                if self.returncode is None:
                    reply = self.channel.read()
                    self.returncode = -signal.SIGKILL if reply is None else reply["returncode"]  # None: server died
                    self.channel.sock.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                _send(self.channel.sock, {"signal": int(sig)})

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Channel:
    """JSON lines on a stream socket, one object per line."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def ready(self, timeout: float | None) -> bool:
        return b"\n" in self.buffer or bool(select.select([self.sock], [], [], timeout)[0])

    def read(self) -> dict | None:
        """The next object; None once the other side has closed."""
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def serve(argv: list[str]) -> None:
    """Fork an agent for each launch the launcher sends, report how each ended; end when the launcher does."""
    launcher = int(argv[0])
    preload = argv[1].split("=", 1)[1].split(",") if len(argv) > 1 else []
    here = os.getcwd()
    control, devnull = socket.socket(fileno=os.dup(0)), os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the launcher's terminal is the launcher's to handle
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    processes.take_environment(dict(os.environ))  # where an agent cannot show its run's environment, serve none
    import torch.distributed.run  # noqa: F401 - the point: every agent forked from here has torch imported

    from partrain_edu.launcher import agent

    for module in preload:
        importlib.import_module(module)
    running: dict[int, _Channel] = {}   # pid → its launch's channel, until it is reaped
    pids: dict[socket.socket, int] = {}  # a launch's socket → its agent's pid
    accepting = True
    while os.getppid() == launcher and (accepting or running):
        readable = select.select([control, wake_r, *pids] if accepting else [wake_r, *pids], [], [], 0.5)[0]
        if wake_r in readable:
            os.read(wake_r, 1 << 12)
            _reap(running, pids)
        if control in readable:
            message, fds, _, _ = socket.recv_fds(control, 16, 2)
            if not message:  # retired, or the launcher is ending: finish the runs under way
                accepting = False
                continue
            sock, out = socket.socket(fileno=fds[0]), fds[1]
            pid = _start(sock, out, agent, here, fixed=[control, wake_r, wake_w, *pids])
            os.close(out)
            if pid is None:
                sock.close()
            else:
                running[pid], pids[sock] = _Channel(sock), pid
        for sock in [s for s in readable if s in pids]:  # while its socket is in `pids`, an agent is unreaped
            message = running[pids[sock]].read()
            if message is None:  # the launcher's thread is gone: so is its run
                os.kill(pids.pop(sock), signal.SIGKILL)
            elif "signal" in message:
                os.kill(pids[sock], message["signal"])


def _reap(running: dict[int, _Channel], pids: dict[socket.socket, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        channel = running.pop(pid, None)
        if channel is not None and pids.pop(channel.sock, None) is not None:  # the launch still listens
            with contextlib.suppress(OSError):
                _send(channel.sock, {"returncode": os.waitstatus_to_exitcode(status)})
        if channel is not None:
            channel.sock.close()


def _start(sock: socket.socket, out: int, agent, here: str, fixed: list) -> int | None:
    """Read a launch's request from `sock` and fork its agent; its pid, or None (the request never came)."""
    sock.settimeout(10)
    try:
        request = _Channel(sock).read()
    except (OSError, ValueError):
        request = None
    sock.settimeout(None)
    if request is None:
        return None
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for held in [*fixed, sock]:  # a socket object must not close its number again later
                os.close(held.detach() if isinstance(held, socket.socket) else held)
            code = _become_agent(request, out, agent, here)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - reported as an exec'd interpreter would, on the run's output
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    try:
        _send(sock, {"pid": pid})
    except OSError:  # the launch gave up waiting: its agent goes at once
        os.kill(pid, signal.SIGKILL)
    return pid


def _become_agent(request: dict, out: int, agent, here: str) -> int:
    """In the forked child: take on what an exec'd agent would have, then run it."""
    os.setsid()
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    for name in ("stdout", "stderr"):  # streams on the new files (the old ones could seek), as the server's were
        old = getattr(sys, name)
        raw = open(old.fileno(), "wb", buffering=0 if old.write_through else -1, closefd=False)
        new = io.TextIOWrapper(raw, old.encoding, old.errors, None, old.line_buffering, old.write_through)
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    if sys.path and sys.path[0] == here:
        sys.path[0] = request["cwd"]  # `-m` put the server's working directory first; an agent's is its own
    processes.take_environment(request["env"])
    agent.main([str(os.getppid()), *request["argv"]])
    return 0


if __name__ == "__main__":
    serve(sys.argv[1:])
