"""A progress bar for training runs that take a while: steps done, time spent, time left.

    with StepProgress(total=20, label="ddp on 4 ranks") as progress:
        ...  progress.step(k)  # after each finished step, k = 1..total

In a terminal it is tqdm on stderr, shown only once a run has taken DELAY_S seconds (short runs stay quiet) and
only when stderr is a terminal (logs and pytest stay clean). In a notebook kernel it is a display that shows a
bar after DELAY_S seconds and is emptied when the run ends: the saved notebook keeps an output with no data at
all, the same on every run, which nbval does not even see (it compares data) - so the committed outputs stay
the same whether the run took 3 s or 3 minutes, and notebooks saved before this bar existed still pass. That
display and the thread that redraws it every second are `status_line.Ticker`, shared with the ranks' status line.
"""
from __future__ import annotations

import html
import sys
import time

from tqdm import tqdm

from partrain_edu.launcher import status_line
from partrain_edu.launcher.status_line import Ticker

DELAY_S = status_line.DELAY_S  # runs shorter than this show nothing; longer ones never wait silently past it


class StepProgress:
    def __init__(self, total: int, label: str):
        self.total = total
        self.label = label
        self.start = time.monotonic()
        self.done = 0
        self.up = 0  # ranks whose process has started (`started`), shown while the first step waits
        self.first_step_at: float | None = None  # the first step also pays for starting the ranks
        self.bar = None
        # In a kernel, the display (status_line.py), empty until DELAY_S; elsewhere tqdm. Either is redrawn every
        # second: the time spent keeps moving while the ranks start.
        self.ticker = Ticker(self._draw, terminal=False)
        if self.ticker.handle is None:
            self.bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr, delay=DELAY_S, disable=None)
        self.ticker.start()

    def __enter__(self) -> StepProgress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def started(self, up: int) -> None:
        """`up` ranks have started (the launcher's `started` callback)."""
        self.up = up

    def step(self, done: int) -> None:
        """`done` steps of `total` have finished."""
        with self.ticker.lock:
            now = time.monotonic()
            if self.first_step_at is None:
                self.first_step_at = now
            if self.bar is not None:
                self.bar.update(done - self.done)
            self.done = done
            self._draw(now)

    def close(self) -> None:
        self.ticker.close()  # the display emptied: no data, nothing that differs between runs
        with self.ticker.lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    def text(self, now: float) -> str:
        """"ddp on 4 ranks: 7/20 steps, 00:09 spent, about 00:13 left" (or "starting" before the first step)."""
        spent = tqdm.format_interval(now - self.start)
        if self.done == 0:
            return f"{self.label}: starting{f' ({self.up} up)' if self.up else ''}, {spent} spent"
        left = ""
        if self.done > 1:  # the time per step, without the start-up the first step waited for
            per_step = (now - self.first_step_at) / (self.done - 1)
            left = f", about {tqdm.format_interval(per_step * (self.total - self.done))} left"
        return f"{self.label}: {self.done}/{self.total} steps, {spent} spent{left}"

    def _draw(self, now: float) -> None:  # with the ticker's lock held
        if now - self.start < DELAY_S or self.ticker.closed.is_set():
            return
        if self.bar is not None:
            self.bar.refresh()  # tqdm redraws only on updates: keep its clock running between steps
        if self.ticker.handle is not None:
            text = self.text(now)
            bar = f'<progress value="{self.done}" max="{self.total}" style="width: 12em"></progress>'
            self.ticker.show(text, f"{bar} {html.escape(text)}")
