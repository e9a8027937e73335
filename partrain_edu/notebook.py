"""The `%%torchrun` cell magic, and how launcher output looks in a notebook: live while the ranks run, tidy and
repeatable when they finish.

    %%torchrun -n N [--timeout S|none] [--backend auto|gloo|nccl] [--rank R] [-- script args]

runs the cell with `partrain_edu.launch.torchrun` and puts what rank 0 `runtime.publish`ed into the notebook's
variables. A bad option line is one line of error, never argparse's exit or a traceback.

Ranks print concurrently, so the order of their lines changes from run to run. While the cell runs, the lines
appear live in a display area in arrival order (you see the ranks racing). When it finishes, that area is
emptied and the same lines are printed once more grouped by rank — the saved notebook then reads the same on
every run, which is what lets CI compare outputs (nbval) and learners diff their runs.
Outside a notebook kernel (a terminal, pytest) lines are simply printed as they arrive.
"""
from __future__ import annotations

import argparse
import shlex
import time
from typing import Any

USAGE = "%%torchrun -n N [--timeout S|none] [--backend auto|gloo|nccl] [--rank R] [-- script args]"


class MagicUsageError(ValueError):
    """A bad `%%torchrun` line. IPython shows `_render_traceback_` instead of a traceback: one line."""

    def _render_traceback_(self) -> list[str]:
        return [f"UsageError: {self}"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print the usage block and raise SystemExit
        raise MagicUsageError(f"%%torchrun: {message}; usage: {USAGE}")


def seconds(text: str) -> float | None:  # named for argparse's "invalid seconds value: 'abc'"
    return None if text.lower() == "none" else float(text)


def parse_magic_line(line: str) -> tuple[argparse.Namespace, list[str]]:
    """The options of a `%%torchrun` line, and the arguments after `--` for the script."""
    parser = _Parser(prog="%%torchrun", add_help=False)
    parser.add_argument("-n", "--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=seconds, default=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default=None)
    parser.add_argument("--rank", type=int, default=None)
    try:
        words = shlex.split(line)
    except ValueError as error:  # an unclosed quote
        raise MagicUsageError(f"%%torchrun: {error} in {line!r}; usage: {USAGE}") from None
    split = words.index("--") if "--" in words else len(words)
    return parser.parse_args(words[:split]), words[split + 1:]


def run_cell_magic(line: str, cell: str, user_ns: dict[str, Any]):
    """`%%torchrun ...`: run `cell` on the ranks, show their output, publish rank 0's values into `user_ns`."""
    from partrain_edu.launch import DEFAULT_RUN_TIMEOUT_S, TorchrunError, check_arguments, check_timeout, torchrun

    options, script_args = parse_magic_line(line)
    try:
        timeout = check_timeout(getattr(options, "timeout", DEFAULT_RUN_TIMEOUT_S), "--timeout", none="none")
        check_arguments(options.nproc, timeout, options.rank)
    except ValueError as error:
        raise MagicUsageError(f"%%torchrun: {error}") from None
    live = LiveOutput(show_rank=options.rank)
    try:
        result = torchrun(cell, nproc=options.nproc, timeout=timeout, args=script_args,
                          backend=options.backend, show_rank=options.rank, echo=live.line)
    except TorchrunError as error:
        live.finish(error.outputs)
        raise
    live.finish(result.outputs)
    user_ns.update(result.published)
    return result


def load_ipython_extension(ipython) -> None:
    def torchrun_magic(line: str, cell: str) -> None:
        run_cell_magic(line, cell, ipython.user_ns)

    ipython.register_magic_function(torchrun_magic, magic_kind="cell", magic_name="torchrun")


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
