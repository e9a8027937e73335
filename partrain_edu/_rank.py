"""What each rank runs under the launcher: the user's script, with its output labelled and its error kept.

    python -m torch.distributed.run --standalone --nproc-per-node N -m partrain_edu._rank RUN_DIR

RUN_DIR/argv.json holds what to run: ["script.py", args...] or ["--module", "package.module", args...].

Three small jobs, so that the notebook can show one clear story instead of torchrun's wall of text:
1. every line this rank prints is prefixed `[rank k] ` (the launcher sorts the merged stream by that prefix);
2. an uncaught exception is written, with a traceback trimmed to the user's frames, to RUN_DIR/rank{k}.error
   (and a clean finish to RUN_DIR/rank{k}.done, so a timeout can name the ranks that never got there);
3. RUN_DIR/rank{k}.pid lets the launcher kill this rank even though torchrun starts each rank in its own
   session (so killing torchrun's process group alone would leave ranks behind).
"""
from __future__ import annotations

import gc
import io
import json
import os
import runpy
import sys
import time
import traceback


class PrefixedWriter(io.TextIOBase):
    """A text stream that writes whole lines, each starting with `prefix`, to `target`."""

    def __init__(self, target, prefix: str):
        self.target, self.prefix, self.pending = target, prefix, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        if lines:
            # One write() per batch of lines: lines from different ranks never interleave mid-line.
            self.target.write("".join(f"{self.prefix}{line}\n" for line in lines))
            self.target.flush()
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.target.write(f"{self.prefix}{self.pending}\n")
            self.pending = ""
        self.target.flush()

    def isatty(self) -> bool:
        return False


def _user_traceback(exc: BaseException) -> str:
    """The traceback without the launcher's, runpy's and torch's frames: the learner's code is what failed."""
    import torch

    tb = traceback.TracebackException.from_exception(exc)
    skip = (__file__, "<frozen runpy>", runpy.__file__)
    torch_dir = os.path.dirname(torch.__file__) + os.sep  # torch's own wrappers say nothing to a learner
    frames = [f for f in tb.stack if f.filename not in skip]
    user_frames = [f for f in frames if not f.filename.startswith(torch_dir)]
    tb.stack = traceback.StackSummary.from_list(user_frames or frames)
    return "".join(tb.format())


def main(argv: list[str]) -> int:
    run_dir = argv[0]
    with open(os.path.join(run_dir, "argv.json")) as f:
        rest = json.load(f)  # [script.py, args...] or ["--module", name, args...]
    rank = int(os.environ.get("RANK", 0))
    with open(os.path.join(run_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    sys.stdout = PrefixedWriter(sys.__stdout__, f"[rank {rank}] ")
    sys.stderr = PrefixedWriter(sys.__stderr__, f"[rank {rank}] ")
    try:
        if rest[0] == "--module":
            sys.argv = [rest[1], *rest[2:]]
            namespace = runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(rest)
            namespace = runpy.run_path(rest[0], run_name="__main__")
        # Objects the script left behind (a DDP model, a P2POp, a subgroup) keep their process group and its
        # Gloo threads alive past destroy_process_group; free them first (see _exit below).
        namespace.clear()
        gc.collect()
    except SystemExit as exit_:  # sys.exit(): a clean exit when its code is 0 or None
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if code:
            _write_error(run_dir, rank, f"SystemExit: {exit_.code}\n", timed_out=False)
            sys.stdout.flush(), sys.stderr.flush()
            return code
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the notebook
        from partrain_edu.runtime import TIMEOUT_HINT, is_timeout_error

        text = _user_traceback(exc)
        timed_out = is_timeout_error(exc)
        if timed_out:
            text += f"\n{TIMEOUT_HINT}\n"
        _write_error(run_dir, rank, text, timed_out)
        sys.stderr.write(text)
        sys.stdout.flush(), sys.stderr.flush()
        return 1
    _destroy_process_group()
    sys.stdout.flush(), sys.stderr.flush()
    open(os.path.join(run_dir, f"rank{rank}.done"), "w").close()  # finished: not among the stuck ones
    return 0


def _destroy_process_group() -> None:
    """A script that leaves its process group alive can make Gloo abort at interpreter exit
    ("terminate called without an active exception"); tear it down for the learner."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _write_error(run_dir: str, rank: int, text: str, timed_out: bool) -> None:
    record = {"rank": rank, "time": time.time(), "traceback": text, "timed_out": timed_out}
    with open(os.path.join(run_dir, f"rank{rank}.error"), "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Skip the interpreter's teardown: a Gloo worker thread still finishing the last collective while C++
    # static destructors run aborts the process ("terminate called without an active exception") in a
    # fraction of runs. Output is flushed and every file closed by now, so nothing is lost.
    sys.stdout.flush(), sys.stderr.flush()
    os._exit(code)
