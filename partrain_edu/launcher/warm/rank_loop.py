"""What each warm rank runs: a loop that executes cell after cell in one namespace, for `launcher.warm.pool.Pool`.

    main([POOL_DIR])           run by the rank's worker (`nanny.rank_main`), as `launcher.rank.main` is

The rank takes message after message from the run's store (the rendezvous store on 127.0.0.1 the kernel hosts,
`launcher.rendezvous`): key partrain/to/{rank}/{n}, a line of JSON. A cell's code runs with `exec` in one
`__main__` module, the same for every cell, so variables survive from cell to cell. When the cell ends, the rank
flushes its output, writes the cell's end mark as a line of its own (the kernel cuts the output stream there: no
line leaks into the next cell) and answers at partrain/from/{rank}/{n}: {} or its error report (`describe`).
The watchdog and the clean-up at exit are `launcher.rank`'s; the call records `call_records`'s. SIGINT (the
stop button) raises KeyboardInterrupt only inside a cell.
"""
from __future__ import annotations

import builtins
import contextlib
import itertools
import json
import linecache
import os
import shutil
import signal
import sys
import types
from datetime import timedelta

import torch.distributed as dist

from partrain_edu.launcher import call_records
from partrain_edu.launcher import rank as rank_side  # the one-shot wrapper, whose pieces the loop reuses
from partrain_edu.launcher.diagnose.oneshot import explain_mismatch

TO, FROM = "partrain/to", "partrain/from"  # the store's keys: TO/{rank}/{n}, the kernel's nth message to a rank


class _Cell:
    """Whether a cell is running: the stop button interrupts a cell, never the loop that waits between cells."""

    running = False


def _on_sigint(signum: int, frame) -> None:
    if _Cell.running:
        raise KeyboardInterrupt


def main(argv: list[str]) -> int:
    pool_dir = argv[0]
    rank = rank_side.started(pool_dir)
    signal.signal(signal.SIGINT, _on_sigint)
    # The cells' module is __main__, as a script's is: a class defined in a cell can be pickled (torch.save).
    main_module = types.ModuleType("__main__")
    main_module.__builtins__ = builtins
    sys.modules["__main__"], namespace = main_module, main_module.__dict__
    kernel_died = True
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(days=365))  # a store's `get` waits this long for the next cell
        for n in itertools.count(1):
            message = json.loads(store.get(f"{TO}/{rank}/{n}"))
            if message["op"] == "stop":
                kernel_died = False
                break
            try:
                report = run_cell(message["code"], message.get("name") or f"cell {message['cell']}", namespace)
            except KeyboardInterrupt:  # it landed between the cell's end and the flag's reset
                report = describe(KeyboardInterrupt())
            # The end mark goes to the same file as the cell's output, after it: the kernel cuts the stream here.
            os.write(1, f"{message['mark']}\n".encode())
            store.set(f"{FROM}/{rank}/{n}", json.dumps(report))
    except RuntimeError:  # torch's DistNetworkError: the kernel, which hosts the store, went away
        pass
    finally:
        if kernel_died:  # this rank ends before its watchdog can notice, so it does the watchdog's first job:
            shutil.rmtree(pool_dir, ignore_errors=True)  # the kernel's folder
        # What the cells left is never freed: the rank ends with os._exit (see `launcher.rank._run` for why).
        rank_side.finish()
    return 0


def run_cell(code: str, name: str, namespace: dict) -> dict:
    """Run one cell's code in `namespace`; {} if it finished, else what went wrong (see `describe`). `name` is
    how tracebacks call the cell: "In[27]", the notebook's prompt, or "cell 4", the pool's count."""
    filename = f"<dist {name}>"
    # Registered like IPython's cells, so that a traceback shows the learner's line, not just its number.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    report: dict = {}
    call_records.between_cells()
    try:
        _Cell.running = True
        exec(compile(code, filename, "exec"), namespace)
    except SystemExit as exit_:  # sys.exit() ends the cell; like a script, a code of 0 or None is no failure
        if exit_.code not in (0, None):
            report = describe(exit_)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the notebook, and the rank live on
        report = describe(exc)
    finally:
        _Cell.running = False
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(ValueError, OSError):  # a cell may have closed or replaced it
            stream.flush()
    return report


def describe(exc: BaseException) -> dict:
    """The learner's traceback (once: it is not printed on the rank's output), and what kind of failure it is."""
    error = rank_side.report(exc, skip=(__file__,))
    mismatch = explain_mismatch(error["traceback"])
    return {**error, "interrupted": isinstance(exc, KeyboardInterrupt), "mismatch": mismatch}
