"""torchrun's own `main`, with the exit code of every rank that failed saved where the launcher reads it.

    python -m partrain_edu.launcher.torchrun_main [torchrun options] ...      (a netem node; `agent` calls `run`)

torchrun ends a failed run by raising `ChildFailedError` (torch.distributed.elastic.multiprocessing.errors),
whose `failures` map each failed rank (global) to a `ProcessFailure` with its `exitcode` (negative: the signal
that killed it). `run` saves {rank: exitcode} to RUN_DIR/exit_codes.<pid>.json (one file per node's torchrun)
before it re-raises, RUN_DIR being the folder above the ranks' publish folder; `exit_codes(run_dir)` reads them
all (`diagnose.oneshot`, `warm.pool`). torchrun's printed report stays for the learner to read, never parsed.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from partrain_edu.runtime import PUBLISH_DIR_ENV


def run(argv: list[str]) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(argv)
    except ChildFailedError as failed:
        codes = {int(rank): int(failure.exitcode) for rank, failure in failed.failures.items()}
        path = Path(os.environ[PUBLISH_DIR_ENV]).parent / f"exit_codes.{os.getpid()}.json"
        part = path.with_suffix(".part")
        part.write_text(json.dumps(codes))
        os.replace(part, path)   # whole or absent: the launcher may read at any moment
        raise


def exit_codes(run_dir: str | os.PathLike) -> dict[int, int]:
    """{rank: exit code} of every rank a torchrun of this run reported failed; {} before any did."""
    codes = {}
    for path in sorted(Path(run_dir).glob("exit_codes.*.json")):
        codes.update({int(rank): int(code) for rank, code in json.loads(path.read_text()).items()})
    return codes


if __name__ == "__main__":
    run(sys.argv[1:])
