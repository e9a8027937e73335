"""A live line while ranks start and while a cell waits for them, gone when the cell ends.

    with RankStatus(4, limit=300) as status:      # "starting 4 ranks… 8 s (2 of 4 up)"
        torchrun(..., started=status.started)      # then "4 ranks running — 12 s (limit 300 s)"

`Ticker` is the piece shared with `progress.StepProgress`: a daemon thread redraws every TICK_S under a lock that
the owner's own updates take too, and `close()` ends it. In a notebook kernel it draws into a display that starts
and ends with no data at all: the saved output is the same on every run (nbval compares data, and sees none). On a
terminal it is one line on stderr, erased at the end; anywhere else (a pipe, a log, pytest) it shows nothing.
A line appears only after DELAY_S: a quick cell looks as it always did. It says only what the code knows: a rank
counts as "up" once its process has started (its run-folder pid file).
"""
from __future__ import annotations

import html
import sys
import threading
import time
from typing import Callable

DELAY_S = 1.5  # a cell quicker than this shows no line at all; a loaded machine's thread may draw it ~0.5 s late
TICK_S = 0.5  # redraw this often: the seconds keep moving while nothing else does


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (an IPython terminal or a script is not)."""
    shell = sys.modules.get("IPython") and sys.modules["IPython"].get_ipython()
    return type(shell).__name__ == "ZMQInteractiveShell"


class Ticker:
    """Once `start()`ed, calls `draw(now)` every TICK_S seconds from a daemon thread, under `lock`, until `close()`.
    `show(text, html)` fills the kernel's display (or, with terminal=True, a tty's stderr line); `close()` empties
    it."""

    def __init__(self, draw: Callable[[float], None], terminal: bool = True):
        self.draw = draw
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self.handle = None
        self.tty = None
        self.shown = ""
        if in_kernel():
            from IPython.display import display

            self.handle = display({}, raw=True, display_id=True)  # no data: nothing on screen yet
        elif terminal and getattr(sys.stderr, "isatty", lambda: False)():
            self.tty = sys.stderr
        self.thread = threading.Thread(target=self._tick, name="partrain-live-line", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _tick(self) -> None:
        while not self.closed.wait(TICK_S):
            with self.lock:
                if not self.closed.is_set():
                    self.draw(time.monotonic())

    def show(self, text: str, html_text: str | None = None) -> None:
        """Call with `lock` held."""
        if self.handle is not None:
            self.handle.update({"text/plain": text, "text/html": html_text or html.escape(text)}, raw=True)
        elif self.tty is not None:
            self.tty.write(f"\r{text}\x1b[K")
            self.tty.flush()
        self.shown = text

    def around(self, echo: Callable[[int | None, str], None]) -> Callable[[int | None, str], None]:
        """`echo`, made to step around the terminal line (rank lines printed on the same screen stay whole)."""
        if self.tty is None:
            return echo

        def echo_around(rank: int | None, text: str) -> None:
            with self.lock:
                shown = self.shown
                self._erase()
                echo(rank, text)
                if shown and not self.closed.is_set():
                    self.show(shown)
        return echo_around

    def _erase(self) -> None:
        if self.tty is not None and self.shown:
            self.tty.write("\r\x1b[K")
            self.tty.flush()
        self.shown = ""

    def close(self) -> None:
        """Empty the line (the kernel's display keeps no data) and let the thread end. Safe to call twice."""
        self.closed.set()
        with self.lock:
            if self.handle is not None:
                self.handle.update({}, raw=True)  # nothing on screen, nothing that differs between runs
                self.handle = None
            self._erase()
        if self.thread.ident is not None and self.thread is not threading.current_thread():
            self.thread.join(2 * TICK_S)


class StatusLine:
    """A line `text(seconds since start)`, shown from DELAY_S on, redrawn every TICK_S; a context manager.
    `tick()`, if given, is called on every redraw, from the start (the live rank output's `flush`)."""

    def __init__(self, text: Callable[[float], str], tick: Callable[[], None] | None = None,
                 since: float | None = None):
        # `since`: the clock's start (time.monotonic()) when the wait began before this line, e.g. at the cell's
        # start, while the launcher and torch were still loading under an earlier line.
        self.text, self.tick = text, tick
        self.start = time.monotonic() if since is None else since
        self.ticker = Ticker(self._draw)
        if since is not None:  # taking over a line already shown: no blank until the first tick
            with self.ticker.lock:
                self._draw(time.monotonic())
        self.ticker.start()

    def _draw(self, now: float) -> None:
        if self.tick is not None:
            self.tick()
        if now - self.start >= DELAY_S:
            line = self.text(now - self.start)
            self.ticker.show(line, f'<span style="opacity: 0.7">{html.escape(line)}</span>')

    def around(self, echo: Callable[[int | None, str], None]) -> Callable[[int | None, str], None]:
        return self.ticker.around(echo)

    def close(self) -> None:
        self.ticker.close()

    def __enter__(self) -> StatusLine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class RankStatus(StatusLine):
    """`starting` until all `nproc` ranks are up (`started(k)` says k are), then `running`. Both are templates with
    {n} (ranks), {s} (seconds so far), {limit} ("limit 300 s" or "no limit") and {up} (" (2 of 4 up)" or "")."""

    def __init__(self, nproc: int, limit: float | None, starting: str = "starting {n} ranks… {s} s{up}",
                 running: str = "{n} ranks running — {s} s ({limit})", up: int = 0,
                 tick: Callable[[], None] | None = None, since: float | None = None):
        self.nproc = nproc
        self.up = up
        self.starting = starting
        self.running = running
        self.limit = "no limit" if limit is None else f"limit {limit:g} s"
        super().__init__(self.line, tick, since)

    def started(self, up: int) -> None:
        """`up` ranks have started (called by the launcher as that number grows)."""
        self.up = up

    def line(self, seconds: float) -> str:
        template = self.running if self.up >= self.nproc else self.starting
        up = f" ({self.up} of {self.nproc} up)" if 0 < self.up < self.nproc else ""
        return template.format(n=self.nproc, s=int(seconds), limit=self.limit, up=up)
