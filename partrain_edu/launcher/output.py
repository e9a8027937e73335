"""How a launch carries its ranks' output: `[rank k] text` lines in, one `Run` of bookkeeping, a `TorchrunResult` out.

Every rank's wrapper (`launcher.rank`, `launcher.warm.rank_loop`) prefixes what the rank prints with `[rank k] `
(RANK_LINE); torchrun's own logging has no prefix and is kept apart, for the error message only. `Lines` reads a
pipe of such lines without blocking longer than asked and without trusting the bytes to be UTF-8 (a rank may write
anything). The one-shot launcher (`launcher.oneshot`), the warm pool and netem's two nodes share all three.
"""
from __future__ import annotations

import os
import re
import select
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

RANK_LINE = re.compile(r"^\[rank (\d+)\] ?(.*)$")


@dataclass
class TorchrunResult:
    returncode: int
    outputs: dict[int, str]  # rank -> everything that rank printed (stdout and stderr)
    published: dict[str, Any]  # name -> value from `runtime.publish` on rank 0
    wall_s: float
    launcher_output: str = ""


@dataclass
class Run:
    """The bookkeeping of one launch: output per rank, and what torchrun itself said."""

    nproc: int
    run_dir: Path
    echo: Callable[[int | None, str], None]
    show_rank: int | None
    outputs: dict[int, list[str]] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cgroup: str | None = None  # the run's cgroup, where one could be made (cgroup.py)

    def take(self, line: str) -> None:
        match = RANK_LINE.match(line)
        if match is None:
            self.launcher.append(line)  # torchrun's logging: kept for the error message, not shown
            return
        rank, text = int(match.group(1)), match.group(2)
        self.outputs.setdefault(rank, []).append(text)
        if self.show_rank is None or rank == self.show_rank:
            self.echo(rank, text)

    def texts(self) -> dict[int, str]:
        return {r: "\n".join(lines) + "\n" for r, lines in sorted(self.outputs.items())}

    def ranks_with(self, suffix: str) -> set[int]:
        """Ranks that wrote RUN_DIR/rank{k}{suffix}: .pid started, .error raised, .done finished cleanly."""
        return {int(p.name[4:-len(suffix)]) for p in self.run_dir.glob(f"rank*{suffix}")}


def print_echo(rank: int | None, text: str) -> None:
    print(f"[rank {rank}] {text}", flush=True)


class Lines:
    """A pipe's output as lines, read without blocking for longer than asked and without trusting its bytes to be
    UTF-8 (a rank may write anything to its stdout)."""

    def __init__(self, fd: int, take: Callable[[str], None]):
        self.fd = fd
        self.take = take
        self.pending = b""
        self.eof = False
        self.poller = select.poll()  # not select(): a long-lived kernel may hold more than 1024 descriptors
        self.poller.register(fd, select.POLLIN)

    def read(self, wait_s: float) -> None:
        if self.eof:
            time.sleep(wait_s)
            return
        if not self.poller.poll(wait_s * 1000):
            return
        chunk = os.read(self.fd, 1 << 16)
        if not chunk:
            self.eof, chunk = True, b"\n" if self.pending else b""
        *complete, self.pending = (self.pending + chunk).split(b"\n")
        for line in complete:
            self.take(line.decode("utf-8", errors="replace"))

    def read_ready(self) -> None:
        """Read what the pipe holds now: all a process that has exited wrote, whether or not others still hold it."""
        while not self.eof and self.poller.poll(0):
            self.read(0)

    def drain(self, grace_s: float) -> None:
        """Read what is left, until the pipe closes or `grace_s` seconds have passed."""
        end = time.monotonic() + grace_s
        while not self.eof and (left := end - time.monotonic()) > 0:
            self.read(min(0.1, left))
