"""The live line while ranks start and while a cell waits (status_line.py): what it says in each phase; in a
notebook kernel (faked here: a display that records its updates) it appears once a run outlasts the delay and
is emptied when the cell ends, for `%%torchrun` and for a check stuck in a deadlock; outside a kernel stdout is
unchanged and only a terminal's stderr gets the line; its thread never outlives the cell."""
import io
import threading
import time

import pytest

from partrain_edu.grading import CHECKS, run_check
from partrain_edu.launcher import status_line
from partrain_edu.launcher.status_line import RankStatus, StatusLine
from partrain_edu.notebook import live_output
from partrain_edu.notebook import magics as notebook
from partrain_edu.notebook.magics import run_cell_magic
from test_grading_ranks import ring_receive_first  # every rank receives before it sends: a deadlock


class _Handle:
    def __init__(self, data: dict):
        self.updates = [dict(data)]

    def update(self, data: dict, raw: bool = False) -> None:
        self.updates.append(dict(data))

    def texts(self) -> list[str]:
        return [u.get("text/plain", "") for u in self.updates]


@pytest.fixture
def kernel(monkeypatch) -> list[_Handle]:
    """A fake notebook kernel: every display made is recorded, with all its updates. A short delay and tick."""
    handles: list[_Handle] = []

    def display(data: dict, raw: bool = False, display_id: bool = False) -> _Handle:
        handles.append(_Handle(data))
        return handles[-1]

    monkeypatch.setattr("IPython.display.display", display)
    monkeypatch.setattr(status_line, "in_kernel", lambda: True)
    monkeypatch.setattr(live_output, "in_kernel", lambda: True)
    monkeypatch.setattr(status_line, "DELAY_S", 0.5)
    monkeypatch.setattr(status_line, "TICK_S", 0.2)
    return handles


def live_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "partrain-live-line"]


def test_the_line_says_starting_until_every_rank_is_up_then_running():
    status = RankStatus(4, 300)
    status.close()
    assert status.line(8.6) == "starting 4 ranks… 8 s"
    status.started(2)
    assert status.line(9.0) == "starting 4 ranks… 9 s (2 of 4 up)"
    status.started(4)
    assert status.line(12.2) == "4 ranks running — 12 s (limit 300 s)"
    with RankStatus(2, None, up=2) as status:
        assert status.line(3) == "2 ranks running — 3 s (no limit)"
    assert live_threads() == []


CELL = "import time\ntime.sleep(2)\nprint('slept')\n"


@pytest.mark.timeout(120)
def test_in_a_kernel_a_torchrun_cell_shows_the_line_live_and_leaves_it_empty(kernel, capsys, monkeypatch):
    monkeypatch.setattr(status_line, "DELAY_S", 0.0)  # a warm start (the forkserver's) takes well under 0.1 s
    run_cell_magic("-n 2 --timeout 90", CELL, {})
    loading, rank_output, status = kernel  # the line while the launcher loads, LiveOutput's display, the ranks' line
    assert loading.updates[0] == {} and loading.updates[-1] == {}, loading.updates
    texts = status.texts()
    assert status.updates[0] == {} and status.updates[-1] == {}, status.updates  # the saved output: no data
    assert any(t.startswith("starting 2 ranks… ") for t in texts), texts
    assert any(t.startswith("2 ranks running — ") and t.endswith(" s (limit 90 s)") for t in texts), texts
    assert capsys.readouterr().out == "[rank 0] slept\n[rank 1] slept\n"  # as before: the ranks' grouped lines
    assert live_threads() == []


@pytest.mark.timeout(120)
def test_a_deadlocked_check_says_it_waits_then_gives_its_verdict(kernel):
    # 15 s: the ranks must be up before the limit even on a loaded machine (the status then says it waits)
    result = run_check("ring_all_reduce", ring_receive_first, timeout=15)
    assert "timed out (limit 15 s)" in result.message, result.message
    [status] = kernel
    texts = status.texts()
    n = CHECKS["ring_all_reduce"].nproc
    assert any(t.startswith(f"check: waiting for {n} ranks (") and t.endswith(" s, limit 15 s)") for t in texts), texts
    assert status.updates[-1] == {}
    assert live_threads() == []


def test_a_line_handed_over_keeps_counting_from_the_cell_start(kernel):
    # The magics start a line before the launcher (and torch) load; the ranks' line then counts from that start.
    began = time.monotonic() - 5.0
    with RankStatus(4, 300, since=began):
        time.sleep(0.5)
    [status] = kernel
    shown = [t for t in status.texts() if t]
    assert shown and shown[0].startswith("starting 4 ranks… 5 s"), shown


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_outside_a_kernel_stdout_stays_as_it_was_and_only_a_terminal_gets_the_line(monkeypatch, capsys):
    monkeypatch.setattr(status_line, "DELAY_S", 0.0)
    monkeypatch.setattr(status_line, "TICK_S", 0.05)
    for stream, shown in ((io.StringIO(), False), (_Terminal(), True)):
        monkeypatch.setattr("sys.stderr", stream)
        with StatusLine(lambda s: "starting 2 ranks… 0 s") as line:
            threading.Event().wait(0.3)
            line.around(lambda rank, text: print(f"[rank {rank}] {text}"))(0, "hello")
        assert capsys.readouterr().out == "[rank 0] hello\n"  # whole: the terminal line stepped aside
        said = stream.getvalue()
        assert ("\rstarting 2 ranks… 0 s\x1b[K" in said and said.endswith("\r\x1b[K")) == shown, repr(said)
        assert said == "" or shown
    assert live_threads() == []


@pytest.mark.timeout(120)
def test_in_a_kernel_warm_ranks_show_the_line_while_they_start_and_while_a_cell_runs(kernel, capsys, monkeypatch):
    monkeypatch.setattr(status_line, "DELAY_S", 0.0)  # as above
    try:
        notebook.run_dist_magic("start -n 2 --timeout 60", None, {})
        notebook.run_dist_magic("", "import time\ntime.sleep(1.5)", {})
    finally:
        notebook.run_dist_magic("stop", None, {})
    # `%dist start`: the line while the launcher loads, LiveOutput's display, the ranks' line; a cell: the last two
    starting, running = kernel[2].texts(), kernel[4].texts()
    assert any(t.startswith("starting 2 warm ranks… ") for t in starting), starting
    assert any(t.startswith("2 warm ranks running — ") and t.endswith(" s (limit 60 s)") for t in running), running
    assert kernel[0].updates[-1] == kernel[2].updates[-1] == kernel[4].updates[-1] == {}
    assert "2 warm ranks ready" in capsys.readouterr().out
    assert live_threads() == []


def test_rank_lines_that_come_close_together_are_all_shown_by_the_next_tick(kernel):
    live = live_output.LiveOutput()
    live.line(0, "first")
    live.line(1, "second")  # within REFRESH_S of the first drawing: not drawn yet
    assert kernel[0].texts()[-1] == "[rank 0] first"
    with StatusLine(lambda s: "", tick=live.flush):
        threading.Event().wait(0.5)  # two ticks of 0.2 s
    assert kernel[0].texts()[-1] == "[rank 0] first\n[rank 1] second"
