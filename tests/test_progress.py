"""The progress bar of long runs: an estimate that leaves out the start-up, tqdm in a terminal, and in a notebook a
widget that leaves the saved output the same on every run."""
import io

import nbformat
import pytest
from nbclient import NotebookClient

from partrain_edu import progress
from partrain_edu.progress import StepProgress


def test_the_estimate_counts_steps_not_the_start_up():
    bar = StepProgress(total=20, label="ddp on 4 ranks")
    bar.close()
    bar.start = 100.0
    assert bar.text(107.0) == "ddp on 4 ranks: starting, 00:07 spent"
    bar.done, bar.first_step_at = 1, 110.0  # the first step came after 10 s of starting the ranks
    assert bar.text(110.0) == "ddp on 4 ranks: 1/20 steps, 00:10 spent"
    bar.done = 5  # 4 more steps in 8 s: 2 s a step, 15 steps to go
    assert bar.text(118.0) == "ddp on 4 ranks: 5/20 steps, 00:18 spent, about 00:30 left"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_tqdm_on_stderr_and_a_log_gets_nothing(monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    for stream, shown in ((_Terminal(), True), (io.StringIO(), False)):
        monkeypatch.setattr("sys.stderr", stream)
        with StepProgress(total=3, label="zero2 on 2 ranks") as bar:
            for done in (1, 2, 3):
                bar.step(done)
        assert ("zero2 on 2 ranks" in stream.getvalue() and "3/3" in stream.getvalue()) == shown, stream.getvalue()


CELL = """
from partrain_edu import progress
progress.DELAY_S = 0.0
with progress.StepProgress(total=3, label="ddp on 2 ranks") as bar:
    for done in (1, 2, 3):
        bar.step(done)
print("trained")
"""


@pytest.mark.timeout(120)
def test_in_a_notebook_the_bar_is_live_then_leaves_an_output_with_no_data():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL)])
    updates = []
    client = NotebookClient(notebook, timeout=60, kernel_name="python3")
    apply_update = client._update_display_id  # nbclient applies each update to the saved output: record them

    def record(display_id, msg):
        updates.append(dict(msg["content"]["data"]))
        apply_update(display_id, msg)

    client._update_display_id = record
    client.execute()
    outputs = notebook.cells[0].outputs
    assert [o["output_type"] for o in outputs] == ["display_data", "stream"]
    assert outputs[0]["data"] == {} and outputs[1]["text"] == "trained\n"  # the same on every run
    assert updates[-1] == {} and "ddp on 2 ranks: 3/3 steps" in updates[-2]["text/plain"]  # it was live
    assert '<progress value="3" max="3"' in updates[-2]["text/html"]
