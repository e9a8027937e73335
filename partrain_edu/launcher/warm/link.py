"""The kernel's end of a warm pool (`launcher.warm.pool`): the launch, and everything that comes from it.

The ranks start as a one-shot run's do (`launcher.start`), running `warm.rank_loop`. Messages go both ways through
the run's loopback store (`rendezvous.open_store`, hosted here): `send` puts the nth message to a rank at
partrain/to/{rank}/{n}, and `pump` reads the answers of the cell in flight and the ranks' output files
(`output.Tail`). A rank's line goes to the cell in flight until that rank's end mark, and to its next cell after:
no line of one cell ever shows up in another. A rank whose worker saved its exit code (`nanny`) has ended.
"""
from __future__ import annotations

import json
import time

from partrain_edu.launcher import cgroup, nanny, processes, supervise
from partrain_edu.launcher.diagnose.warm import Cell
from partrain_edu.launcher.output import Run, Tail
from partrain_edu.launcher.start import Launch
from partrain_edu.launcher.warm.rank_loop import FROM, TO

MARK_PREFIX = "#partrain-cell-end-"


class Link:
    def __init__(self, run: Run, env: dict[str, str]):
        self.run_dir = run.run_dir
        self.run_id = run.run_id
        self.cell: Cell | None = None  # the cell in flight
        self.launcher: list[str] = run.launcher  # torch's agent's own lines, for the error messages
        self.pending: dict[int, list[str]] = {}  # what a rank wrote after its last cell's end mark
        self.sent: dict[int, int] = {}  # rank -> how many messages it was sent
        self.cgroup = cgroup.create(self.run_id)  # where allowed: nothing a rank starts escapes it (cgroup.py)
        self.tail = Tail(run.run_dir, self._take)
        try:
            self.proc = Launch(run, "partrain_edu.launcher.warm.rank_loop",
                               {**env, cgroup.ENV: self.cgroup} if self.cgroup else env)
        except BaseException:
            cgroup.kill(self.cgroup)
            raise

    def alive(self) -> bool:
        return self.proc.poll() is None and not nanny.rank_files(self.run_dir, ".exit")

    def pids(self) -> dict[int, processes.Proc]:
        """The ranks that have started (their .pid file: `launcher.rank.started`)."""
        return {rank: processes.named(ident) for rank, ident in nanny.identities(self.run_dir, ".pid").items()}

    def send(self, rank: int, message: dict) -> None:
        self.sent[rank] = self.sent.get(rank, 0) + 1
        self.proc.store.set(f"{TO}/{rank}/{self.sent[rank]}", json.dumps(message))

    def signal(self, ranks: list[int], sig: int) -> None:
        pids = self.pids()
        processes.signal_each([pids[r] for r in ranks if r in pids], sig)

    def pump(self, wait_s: float) -> None:
        """Route what arrived, then wait `wait_s` seconds."""
        self.tail.read()
        for rank in self.cell.running() if self.cell is not None else ():
            key = f"{FROM}/{rank}/{self.sent[rank]}"
            if self.proc.store.check([key]):
                self.cell.done[rank] = {**json.loads(self.proc.store.get(key)), "rank": rank}
                self.cell.done_at[rank] = time.monotonic()
        time.sleep(wait_s)

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

    def hang_up(self, nproc: int, wait_s: float) -> None:
        """Tell every rank to stop (its loop ends, it exits cleanly) and wait up to `wait_s` for torch's agent to see
        them all finish. A rank whose store went away knows that the kernel died."""
        for rank in range(nproc):
            self.send(rank, {"op": "stop"})
        end = time.monotonic() + wait_s
        while self.proc.poll() is None and time.monotonic() < end:
            self.tail.read()
            time.sleep(0.05)

    def kill(self) -> None:
        """Kill every process of the pool: the ranks, their workers, whatever they started (as a one-shot run's)."""
        supervise.stop([self.proc], self)
        self.tail.close()
