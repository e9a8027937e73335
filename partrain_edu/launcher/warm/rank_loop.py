"""What each warm rank runs: a loop that executes cell after cell in one namespace, for `launcher.warm.pool.Pool`.

    nanny: rank_loop.main([POOL_DIR]), forked by the rank's worker, or `python -m ...warm.rank_loop POOL_DIR`

The rank connects to the pool's Unix socket POOL_DIR/control.sock and says hello (its rank and pid). Then each
message is a cell: its code runs with `exec` in a fresh `__main__` module, the same for every cell, so variables
survive from cell to cell. When the cell ends, the rank flushes its output, writes the cell's end mark as a line of
its own (the kernel cuts the output stream there: no line leaks into the next cell) and answers "done", with the
learner's traceback (trimmed as in `launcher.rank`) if the cell raised. Messages: JSON, one per line.

The watchdog that kills the pool when the kernel dies, and the clean-up at exit, are `launcher.rank`'s; the record
of the rank's collective calls is `launcher.call_records`'s (POOL_DIR/rank{k}.calls).
SIGINT (the notebook's stop button) raises KeyboardInterrupt only inside a cell.
"""
from __future__ import annotations

import builtins
import contextlib
import json
import linecache
import os
import shutil
import signal
import socket
import sys
import types

from partrain_edu.launcher import call_records
from partrain_edu.launcher import rank as rank_side  # the one-shot wrapper, whose pieces the loop reuses
from partrain_edu.launcher.diagnose.oneshot import explain_mismatch

SOCKET_NAME = "control.sock"


def send(sock: socket.socket, message: dict) -> None:
    """One message: a line of JSON (which escapes every newline inside it)."""
    sock.sendall(json.dumps(message).encode() + b"\n")


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
    sock, kernel_died = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM), True
    try:
        sock.connect(os.path.join(pool_dir, SOCKET_NAME))
        send(sock, {"op": "hello", "rank": rank, "pid": os.getpid()})
        for line in sock.makefile("rb"):  # until the kernel closes the socket
            message = json.loads(line)
            if message["op"] == "stop":
                kernel_died = False
                break
            try:
                report = run_cell(message["code"], message.get("name") or f"cell {message['cell']}", namespace)
            except KeyboardInterrupt:  # it landed between the cell's end and the flag's reset
                report = describe(KeyboardInterrupt())
            # The end mark goes to the same file as the cell's output, after it: the kernel cuts the stream here.
            os.write(1, f"{message['mark']}\n".encode())
            send(sock, {"op": "done", "cell": message["cell"], **report})
    except (OSError, ValueError):  # the kernel went away mid-message
        pass
    finally:
        sock.close()
        if kernel_died:  # its socket closed without a "stop": this rank ends before its watchdog can notice, so
            shutil.rmtree(pool_dir, ignore_errors=True)  # it does the watchdog's first job, the kernel's folder
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


if __name__ == "__main__":
    rank_side.run_exec_d(main)
