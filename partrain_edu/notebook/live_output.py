"""The live area under a `%%torchrun` or `%%dist` cell: rank lines as they arrive, then every rank's output in order.

While the ranks run, their lines appear in arrival order (redrawn at most REFRESH_S apart: cheap for the browser;
the status line's thread calls `flush` every second for the lines that came too soon). When the cell ends, the
area is emptied and every rank's output is printed once more, grouped by rank, so the saved notebook reads the same
on every run (nbval compares it in CI). Outside a kernel, lines are printed as they arrive.
"""
from __future__ import annotations

import threading
import time

from partrain_edu.launcher.status_line import in_kernel


class LiveOutput:
    REFRESH_S = 0.2  # redraw the live area at most 5 times a second: cheap for the browser

    def __init__(self, show_rank: int | None = None):
        self.show_rank = show_rank
        self.lines = []
        self.last_draw = 0.0
        self.drawn = 0
        self.handle, self.lock = None, threading.Lock()  # `flush` comes from the status line's thread
        if in_kernel():
            from IPython.display import display

            self.handle = display({"text/plain": ""}, raw=True, display_id=True)

    def line(self, rank: int | None, text: str) -> None:
        entry = f"[rank {rank}] {text}"
        if self.handle is None:
            print(entry, flush=True)
            return
        with self.lock:
            self.lines.append(entry)
            if time.monotonic() - self.last_draw >= self.REFRESH_S:
                self._draw()

    def flush(self) -> None:
        """Draw the lines that came too soon after the last drawing (called every second while the cell runs)."""
        with self.lock:
            if self.handle is not None and self.drawn < len(self.lines):
                self._draw()

    def _draw(self) -> None:
        self.handle.update({"text/plain": "\n".join(self.lines[-200:])}, raw=True)
        self.last_draw, self.drawn = time.monotonic(), len(self.lines)

    def finish(self, outputs: dict[int, str]) -> None:
        """Replace the live area with every rank's output, rank by rank."""
        if self.handle is None:
            return
        with self.lock:
            self.handle.update({"text/plain": ""}, raw=True)
            self.drawn = len(self.lines)
        grouped = [f"[rank {rank}] {line}" for rank, text in sorted(outputs.items())
                   if self.show_rank is None or rank == self.show_rank
                   for line in text.rstrip("\n").split("\n")]
        if grouped:
            print("\n".join(grouped), flush=True)
