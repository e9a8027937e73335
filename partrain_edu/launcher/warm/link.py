"""The kernel's end of a warm pool (`launcher.warm.pool`): the launch, and everything that comes from it.

One poll loop reads the ranks' output files (`output.Tail`) and each rank's control socket (hello, done). A rank's
line goes to the cell in flight until that rank's end mark, and to its next cell after: no line of one cell ever
shows up in another. The ranks start as a one-shot run's do (`launcher.start`), running `warm.rank_loop`.
"""
from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from partrain_edu.launcher import cgroup, processes, supervise
from partrain_edu.launcher.diagnose.warm import Cell
from partrain_edu.launcher.output import Run, Tail
from partrain_edu.launcher.start import Launch
from partrain_edu.launcher.warm import rank_loop

MARK_PREFIX = "#partrain-cell-end-"


@dataclass
class _Conn:
    sock: socket.socket
    rank: int | None = None  # known once the rank has said hello
    buffer: bytes = b""


class Link:
    def __init__(self, run: Run, env: dict[str, str]):
        self.run_dir = run.run_dir
        self.run_id = run.run_id
        self.cell: Cell | None = None  # the cell in flight
        self.launcher: list[str] = run.launcher  # torch's agent's own lines, for the error messages
        self.pending: dict[int, list[str]] = {}  # what a rank wrote after its last cell's end mark
        self.conns: dict[int, _Conn] = {}  # by file descriptor
        self.socks: dict[int, socket.socket] = {}  # by rank
        self.pids: dict[int, processes.Proc] = {}
        self.lost: list[int | None] = []  # ranks whose socket closed (their process ended), in that order
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.poller = select.poll()
        self.cgroup = cgroup.create(self.run_id)  # where allowed: nothing a rank starts escapes it (cgroup.py)
        self.tail = Tail(run.run_dir, self._take)
        try:
            self.listener.bind(str(Path(run.run_dir, rank_loop.SOCKET_NAME)))  # in the pool's 0700 folder
            self.listener.listen(run.nproc)
            self.poller.register(self.listener.fileno(), select.POLLIN)
            self.proc = Launch(run, "partrain_edu.launcher.warm.rank_loop",
                               {**env, cgroup.ENV: self.cgroup} if self.cgroup else env)
        except BaseException:
            self.listener.close()
            cgroup.kill(self.cgroup)
            raise

    def alive(self) -> bool:
        return not self.lost and self.proc.poll() is None

    def send(self, rank: int, message: dict) -> None:
        rank_loop.send(self.socks[rank], message)

    def signal(self, ranks: list[int], sig: int) -> None:
        processes.signal_each([self.pids[r] for r in ranks if r in self.pids], sig)

    def pump(self, wait_s: float) -> None:
        """Route what arrives within `wait_s` seconds."""
        self.tail.read()
        for fd, _ in self.poller.poll(wait_s * 1000):
            if self.listener is not None and fd == self.listener.fileno():
                sock = self.listener.accept()[0]
                self.conns[sock.fileno()] = _Conn(sock)
                self.poller.register(sock.fileno(), select.POLLIN)
            elif (conn := self.conns.get(fd)) is not None:
                self._receive(fd, conn)

    def stop_listening(self) -> None:
        """Every rank is connected: nobody else may."""
        self.poller.unregister(self.listener.fileno())
        self.listener.close()
        self.listener = None

    def _receive(self, fd: int, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:  # the rank's process ended: only its exit closes the socket
            self.poller.unregister(fd)
            conn.sock.close()
            del self.conns[fd]
            self.lost.append(conn.rank)
            return
        *lines, conn.buffer = (conn.buffer + data).split(b"\n")
        for message in map(json.loads, lines):
            if message["op"] == "hello":
                conn.rank = message["rank"]
                self.socks[conn.rank] = conn.sock
                self.pids[conn.rank] = processes.read(message["pid"]) or processes.Proc(message["pid"], 0, 0, 0)
            elif message["op"] == "done" and self.cell is not None and message["cell"] == self.cell.number:
                self.cell.done[conn.rank] = {**message, "rank": conn.rank}
                self.cell.done_at[conn.rank] = time.monotonic()

    def _take(self, rank: int, text: str) -> None:
        cell = self.cell
        if cell is not None and text == cell.mark:
            cell.marked.add(rank)
        elif text.startswith(MARK_PREFIX):
            pass  # the end mark of a cell that ended without waiting for it
        elif cell is not None and rank in cell.ranks and rank not in cell.marked:
            cell.show(rank, text)
        else:
            self.pending.setdefault(rank, []).append(text)

    def hang_up(self, wait_s: float) -> None:
        """Tell every rank to stop (its loop ends, it exits cleanly) and wait up to `wait_s` for torch's agent to see
        them all finish. A socket closed without "stop" means to a rank that the kernel died."""
        for conn in self.conns.values():
            with contextlib.suppress(OSError):  # that rank is gone already
                rank_loop.send(conn.sock, {"op": "stop"})
        self.close()
        end = time.monotonic() + wait_s
        while self.proc.poll() is None and time.monotonic() < end:
            self.tail.read()
            time.sleep(0.05)

    def close(self) -> None:
        for conn in self.conns.values():
            conn.sock.close()
        self.conns.clear()
        if self.listener is not None:
            self.listener.close()
            self.listener = None

    def kill(self) -> None:
        """Kill every process of the pool: the ranks, their workers, whatever they started (as a one-shot run's)."""
        supervise.stop([self.proc], self)
        self.tail.close()
        self.close()
