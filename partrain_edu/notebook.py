"""How launcher output looks in a notebook: live while the ranks run, tidy and repeatable when they finish.

Ranks print concurrently, so the order of their lines changes from run to run. While the cell runs, the lines
appear live in a display area in arrival order (you see the ranks racing). When it finishes, that area is
emptied and the same lines are printed once more grouped by rank — the saved notebook then reads the same on
every run, which is what lets CI compare outputs (nbval) and learners diff their runs.
Outside a notebook kernel (a terminal, pytest) lines are simply printed as they arrive.
"""
from __future__ import annotations

import time


def _in_kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LiveOutput:
    REFRESH_S = 0.2  # redraw the live area at most 5 times a second: cheap for the browser

    def __init__(self, show_rank: int | None = None):
        self.show_rank, self.lines, self.last_draw = show_rank, [], 0.0
        self.handle = None
        if _in_kernel():
            from IPython.display import display

            self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def line(self, rank: int | None, text: str) -> None:
        entry = f"[rank {rank}] {text}"
        if self.handle is None:
            print(entry, flush=True)
            return
        self.lines.append(entry)
        now = time.monotonic()
        if now - self.last_draw >= self.REFRESH_S:
            self.handle.update({"text/plain": "\n".join(self.lines[-200:])}, raw=True)
            self.last_draw = now

    def finish(self, outputs: dict[int, str]) -> None:
        """Replace the live area with every rank's output, rank by rank."""
        if self.handle is None:
            return
        self.handle.update({"text/plain": ""}, raw=True)
        grouped = [f"[rank {rank}] {line}" for rank, text in sorted(outputs.items())
                   if self.show_rank is None or rank == self.show_rank
                   for line in text.rstrip("\n").split("\n")]
        if grouped:
            print("\n".join(grouped), flush=True)
