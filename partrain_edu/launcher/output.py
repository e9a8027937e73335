"""A launch's output: RUN_DIR/rank{k}.out files in, one `Run` of bookkeeping, a `TorchrunResult` out.

Each rank's worker (`nanny`) points the rank's stdout and stderr at RUN_DIR/rank{k}.out, so every line there is
rank k's, whoever wrote it (`print`, C code, a child process). `Tail` reads those files as they grow, as torch's
agent tails its workers' logs, without trusting the bytes to be UTF-8.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from partrain_edu.launcher import nanny

LONGEST_LINE = 1 << 20  # a "line" that never ends is passed on in pieces of this size


@dataclass
class TorchrunResult:
    returncode: int
    outputs: dict[int, str]  # rank -> everything that rank printed (stdout and stderr)
    published: dict[str, Any]  # name -> value from `runtime.publish` on rank 0
    wall_s: float
    launcher_output: str = ""


@dataclass
class Run:
    """The bookkeeping of one launch: output per rank, and what torch's agent itself said."""

    nproc: int
    run_dir: Path
    echo: Callable[[int | None, str], None]
    show_rank: int | None
    outputs: dict[int, list[str]] = field(default_factory=dict)
    launcher: list[str] = field(default_factory=list)  # torch's agent's log lines: for the error message only
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cgroup: str | None = None  # the run's cgroup, where one could be made (cgroup.py)

    def take(self, rank: int, text: str) -> None:
        self.outputs.setdefault(rank, []).append(text)
        if self.show_rank is None or rank == self.show_rank:
            self.echo(rank, text)

    def texts(self) -> dict[int, str]:
        return {r: "\n".join(lines) + "\n" for r, lines in sorted(self.outputs.items())}

    def ranks_with(self, suffix: str) -> set[int]:
        """Ranks that wrote RUN_DIR/rank{k}{suffix}: .pid started, .error raised, .done finished cleanly."""
        return set(nanny.rank_files(self.run_dir, suffix))


def print_echo(rank: int | None, text: str) -> None:
    print(f"[rank {rank}] {text}", flush=True)


class Tail:
    """Every RUN_DIR/rank{k}.out, read as lines as it grows; `take(rank, text)` gets each whole line."""

    def __init__(self, run_dir: Path, take: Callable[[int, str], None]):
        self.run_dir = run_dir
        self.take = take
        self.files: dict[int, Any] = {}
        self.pending: dict[int, bytes] = {}
        self.closed = False

    def read(self) -> None:
        """Pass on every whole line written since the last call."""
        if self.closed:
            return
        for rank, path in nanny.rank_files(self.run_dir, ".out").items():
            if rank not in self.files:
                self.files[rank] = open(path, "rb")  # noqa: SIM115 - held open across calls, closed in close()
                self.pending[rank] = b""
        for rank, file in self.files.items():
            chunk = file.read()
            if not chunk:
                continue
            *lines, rest = (self.pending[rank] + chunk).split(b"\n")
            if len(rest) > LONGEST_LINE:
                lines.append(rest)
                rest = b""
            self.pending[rank] = rest
            for line in lines:
                self.take(rank, line.decode("utf-8", errors="replace"))

    def close(self) -> None:
        """Read what is left, a last line without its newline too; then let go of the files."""
        self.read()
        for rank, file in self.files.items():
            if self.pending[rank]:
                self.take(rank, self.pending[rank].decode("utf-8", errors="replace"))
            file.close()
        self.files.clear()
        self.closed = True
