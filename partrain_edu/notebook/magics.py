"""The `%%torchrun` and `%dist` / `%%dist` magics, and how rank output looks in a notebook: live while the ranks
run, tidy and repeatable when they finish.

    %%torchrun -n N [--timeout S|none] [--backend auto|gloo|nccl] [--device emulated:a100] [--rank R] [-- args]
    %dist start -n N [--backend auto|gloo|nccl] [--device emulated:a100] [--timeout S|none]   (restart, stop, status)
    %%dist [--rank R] [--timeout S|none]

`%%torchrun` runs the cell on fresh ranks (`launcher.oneshot`); `%%dist` runs it on the warm ranks that
`%dist start` left running (`launcher.warm.Pool`: variables survive from cell to cell). Both put what
rank 0 `runtime.publish`ed into the notebook's variables. A bad option line is one line of error.

Ranks print concurrently, so the order of their lines changes from run to run. While the cell runs, they appear
live in arrival order; when it finishes, they are printed once more grouped by rank, so the saved notebook reads
the same on every run (nbval compares it in CI). Outside a kernel, lines are printed as they arrive. Below them
a status line ("starting 4 ranks… 8 s", "4 ranks running — 12 s (limit 300 s)", `launcher.status_line`)
shows while the cell runs and leaves no data behind. This module is thin: the work is the launcher's.
"""
from __future__ import annotations

import argparse
import shlex
from typing import Any

from partrain_edu.launcher.status_line import RankStatus, StatusLine
from partrain_edu.notebook.live_output import LiveOutput

USAGE = ("%%torchrun -n N [--timeout S|none] [--backend auto|gloo|nccl] [--device cpu|emulated:a100] [--rank R] "
         "[-- script args]")


class MagicUsageError(ValueError):
    """A bad `%%torchrun` line. IPython shows `_render_traceback_` instead of a traceback: one line."""

    def _render_traceback_(self) -> list[str]:
        return [f"UsageError: {self}"]


class _Parser(argparse.ArgumentParser):
    def __init__(self, prog: str = "%%torchrun", usage_line: str = USAGE):
        super().__init__(prog=prog, add_help=False)
        self.usage_line = usage_line

    def error(self, message: str):  # argparse would print the usage block and raise SystemExit
        raise MagicUsageError(f"{self.prog}: {message}; usage: {self.usage_line}")


def seconds(text: str) -> float | None:  # named for argparse's "invalid seconds value: 'abc'"
    return None if text.lower() == "none" else float(text)


def device(text: str) -> str:
    """`--device`: cpu, or an emulated device spec (checked here: a bad one is a usage error, not a rank's)."""
    if text != "cpu":
        from partrain_edu.emulated import parse

        try:
            parse(text)
        except ValueError as error:   # argparse would replace a ValueError's words with "invalid value"
            raise argparse.ArgumentTypeError(str(error)) from None
    return text


def _device_env(spec: str | None) -> dict[str, str]:
    """What tells `runtime.init()` on the ranks which device to time with (its `device=` argument wins)."""
    from partrain_edu.runtime import DEVICE_ENV

    return {} if spec is None else {DEVICE_ENV: spec}


def parse_magic_line(line: str) -> tuple[argparse.Namespace, list[str]]:
    """The options of a `%%torchrun` line, and the arguments after `--` for the script."""
    parser = _Parser()
    parser.add_argument("-n", "--nproc", type=int, default=2)
    parser.add_argument("--timeout", type=seconds, default=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default=None)
    parser.add_argument("--device", type=device, default=None)
    parser.add_argument("--rank", type=int, default=None)
    try:
        words = shlex.split(line)
    except ValueError as error:  # an unclosed quote
        raise MagicUsageError(f"%%torchrun: {error} in {line!r}; usage: {USAGE}") from None
    split = words.index("--") if "--" in words else len(words)
    return parser.parse_args(words[:split]), words[split + 1:]


def loading(text: str) -> StatusLine:
    """The status line from a cell's first moment, while the launcher (and with it torch: 1-6 s in a fresh kernel)
    loads; the ranks' own line takes over with `since=` its start, so the seconds count from the cell's start."""
    return StatusLine(lambda s: f"{text}… {int(s)} s")


def run_cell_magic(line: str, cell: str, user_ns: dict[str, Any]):
    """`%%torchrun ...`: run `cell` on the ranks, show their output, publish rank 0's values into `user_ns`."""
    options, script_args = parse_magic_line(line)
    with loading(f"starting {options.nproc} ranks") as first:
        from partrain_edu.launcher import (
            DEFAULT_RUN_TIMEOUT_S,
            TorchrunError,
            TorchrunInterrupted,
            check_arguments,
            check_timeout,
            torchrun,
        )
    try:
        timeout = check_timeout(getattr(options, "timeout", DEFAULT_RUN_TIMEOUT_S), "--timeout", none="none")
        check_arguments(options.nproc, timeout, options.rank)
    except ValueError as error:
        raise MagicUsageError(f"%%torchrun: {error}") from None
    live = LiveOutput(show_rank=options.rank)
    try:  # below the ranks' lines, "starting 4 ranks… 8 s" then "4 ranks running — 12 s (limit 300 s)"
        with RankStatus(options.nproc, timeout, tick=live.flush, since=first.start) as status:
            result = torchrun(cell, nproc=options.nproc, timeout=timeout, args=script_args, backend=options.backend,
                              show_rank=options.rank, echo=status.around(live.line), env=_device_env(options.device),
                              started=status.started)
    except (TorchrunError, TorchrunInterrupted) as error:   # the live area becomes the ranks' grouped output
        live.finish(error.outputs)
        raise
    return _show(live, result, user_ns)


DIST_USAGE = ("%dist start|restart [-n N] [--backend auto|gloo|nccl] [--device cpu|emulated:a100] [--timeout S|none] "
              "| %dist stop | %dist status")
DIST_CELL_USAGE = "%%dist [--rank R] [--timeout S|none]"
_pool = None  # this kernel's warm ranks (`launcher.warm.pool.Pool`), if `%dist start` ever ran


def run_dist_magic(line: str, cell: str | None, user_ns: dict[str, Any]):
    """`%dist start|restart|stop|status ...` (cell None), or a `%%dist ...` cell run on the warm ranks."""
    if cell is None:
        return _dist_command(line)
    from partrain_edu.launcher import DistError, DistInterrupted

    parser = _Parser("%%dist", DIST_CELL_USAGE)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--timeout", type=seconds, default=argparse.SUPPRESS)
    options = parser.parse_args(_words(line, "%%dist", DIST_CELL_USAGE))
    timeout = getattr(options, "timeout", "pool")  # "pool": the limit given to `%dist start`
    if _pool is None or not _pool.up:
        raise MagicUsageError("%%dist: no warm ranks are running; start them with `%dist start -n N`"
                              + ("" if _pool is None else " or `%dist restart`"))
    try:
        if timeout != "pool":
            timeout = _checked_timeout(timeout)
        if options.rank is not None and not 0 <= options.rank < _pool.nproc:
            raise ValueError(f"--rank {options.rank} does not exist with {_pool.nproc} ranks; "
                             f"pick 0..{_pool.nproc - 1}")
    except ValueError as error:
        raise MagicUsageError(f"%%dist: {error}") from None
    live = LiveOutput(show_rank=options.rank)
    running = "{n} warm ranks" if options.rank is None else f"warm rank {options.rank}"
    try:
        with RankStatus(_pool.nproc, _pool.timeout if timeout == "pool" else timeout, up=_pool.nproc,
                        running=running + " running — {s} s ({limit})", tick=live.flush) as status:
            result = _pool.run(cell, rank=options.rank, timeout=timeout, echo=status.around(live.line),
                               name=_prompt())
    except (DistError, DistInterrupted) as error:
        live.finish(error.outputs)
        raise
    return _show(live, result, user_ns)


def _prompt() -> str | None:
    """"In[27]" for the cell the notebook shows as [27], so the ranks' tracebacks name it as IPython's do (None
    outside IPython). IPython counts a cell before running it: while it runs, execution_count is its number + 1."""
    from IPython import get_ipython

    shell = get_ipython()
    return None if shell is None else f"In[{shell.execution_count - 1}]"


def _show(live: LiveOutput, result, user_ns: dict[str, Any]):
    """A cell's end: the live area becomes every rank's output, rank by rank; rank 0's values become variables."""
    live.finish(result.outputs)
    user_ns.update(result.published)
    return result


def _dist_command(line: str):
    global _pool
    parser = _Parser("%dist", DIST_USAGE)
    parser.add_argument("command", choices=["start", "restart", "stop", "status"])
    parser.add_argument("-n", "--nproc", type=int, default=None)
    parser.add_argument("--backend", choices=["auto", "gloo", "nccl"], default=None)
    parser.add_argument("--device", type=device, default=None)
    parser.add_argument("--timeout", type=seconds, default=argparse.SUPPRESS)
    options = parser.parse_args(_words(line, "%dist", DIST_USAGE))
    if options.command in ("stop", "status") and (options.nproc or options.backend or options.device
                                                  or "timeout" in options):
        raise MagicUsageError(f"%dist {options.command} takes no options; usage: {DIST_USAGE}")
    if options.command == "status":
        print(_status_line())
        return None
    if options.command == "stop":
        print("warm ranks stopped" if _pool is not None and _pool.up else "no warm ranks were running")
        if _pool is not None:
            _pool.stop()
        return None
    if options.command == "start" and _pool is not None and _pool.up:
        raise MagicUsageError(f"%dist: {_pool.nproc} warm ranks are already running; `%dist restart` "
                              "replaces them (their variables are lost), `%dist stop` ends them")
    previous = _pool  # `%dist restart` keeps the options it is not given
    nproc = options.nproc or (previous.nproc if previous else 2)
    with loading(f"starting {nproc} warm ranks") as first:
        from partrain_edu.launcher import DEFAULT_RUN_TIMEOUT_S, DistError, Pool, check_arguments
    backend = options.backend or (previous.requested_backend if previous else None)
    env = _device_env(options.device) if options.device else (previous.env if previous else {})
    timeout = getattr(options, "timeout", previous.timeout if previous else DEFAULT_RUN_TIMEOUT_S)
    try:
        check_arguments(nproc, _checked_timeout(timeout), None)
    except ValueError as error:
        raise MagicUsageError(f"%dist: {error}") from None
    if previous is not None:
        with StatusLine(lambda s: f"stopping the {previous.nproc} warm ranks… {int(s)} s"):
            previous.stop()
    _pool, live = None, LiveOutput()
    try:
        with RankStatus(nproc, timeout, starting="starting {n} warm ranks… {s} s{up}",
                        running="starting {n} warm ranks… {s} s (all up, setting up torch.distributed)",
                        tick=live.flush, since=None if previous is not None else first.start) as status:
            _pool = Pool(nproc, backend=backend, timeout=timeout, env=env, echo=status.around(live.line),
                         started=status.started)
    except DistError as error:
        live.finish(error.outputs)
        raise
    live.finish(_pool.start_outputs)
    print(f"{nproc} warm ranks ready ({_pool.backend}). Every `%%dist` cell runs on them, variables kept; each "
          "starts with torch, dist, runtime, ctx, rank and world_size defined.")
    return _pool


def _status_line() -> str:
    if _pool is None:
        return "no warm ranks: `%dist start -n N` starts them"
    state = _pool.status()
    if not state["up"]:
        return f"the warm ranks are down ({state['cells_run']} cells had run): `%dist restart` starts fresh ones"
    return (f"{state['ranks']} warm ranks ({state['backend']}), pids {state['pids']}, {state['cells_run']} cells run, "
            f"up {state['uptime_s']:g} s")


def _checked_timeout(timeout: float | None) -> float | None:
    from partrain_edu.launcher import check_timeout

    return check_timeout(timeout, "--timeout", none="none")


def _words(line: str, prog: str, usage: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as error:  # an unclosed quote
        raise MagicUsageError(f"{prog}: {error} in {line!r}; usage: {usage}") from None


def load_ipython_extension(ipython) -> None:
    def torchrun_magic(line: str, cell: str) -> None:
        run_cell_magic(line, cell, ipython.user_ns)

    def dist_magic(line: str, cell: str | None = None) -> None:
        run_dist_magic(line, cell, ipython.user_ns)

    ipython.register_magic_function(torchrun_magic, magic_kind="cell", magic_name="torchrun")
    ipython.register_magic_function(dist_magic, magic_kind="line_cell", magic_name="dist")
