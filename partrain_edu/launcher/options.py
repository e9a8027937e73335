"""What every launch checks and hands its ranks: the time limits, the arguments, the script, the environment.

One-shot runs, the warm pool and netem's nodes give their ranks one environment (`rank_environment`): one thread
each (2 cores, N ranks), unbuffered output, where rank 0 publishes, the collective timeout (under the run's own
limit, so that a deadlock ends as an error the ranks can explain) and the run's id (`launcher.processes`).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from partrain_edu.launcher import processes
from partrain_edu.runtime import BACKEND_ENV, DEFAULT_TIMEOUT_S, PUBLISH_DIR_ENV, TIMEOUT_ENV

# A cell that runs longer than this is stopped. It catches what the 60 s collective timeout inside the ranks
# cannot (a loop with no collective, a rank blocked outside torch) while leaving ample room for a healthy cell on a
# loaded classroom server: course cells take seconds, and 20 concurrent 2-rank trainings on 2 cores took 260 s.
DEFAULT_RUN_TIMEOUT_S = 300.0
KILL_GRACE_S = 3.0  # SIGTERM, then SIGKILL this much later


def check_timeout(timeout: Any, name: str = "timeout", none: str = "None") -> float | None:
    """`timeout` as seconds, or None for no limit; a one-line ValueError naming `name` for anything else."""
    if timeout is None:
        return None
    try:
        seconds = float(timeout)
    except (TypeError, ValueError):
        seconds = math.nan
    if isinstance(timeout, bool) or not (0 < seconds < math.inf):
        raise ValueError(f"{name} must be a positive, finite number of seconds, not {timeout!r} "
                         f"({none} for no limit)")
    return seconds


def check_arguments(nproc: int, timeout: Any, show_rank: int | None) -> float | None:
    if nproc < 1:
        raise ValueError(f"nproc must be a whole number of at least 1, not {nproc!r}")
    if show_rank is not None and not 0 <= show_rank < nproc:
        raise ValueError(f"--rank {show_rank} does not exist with {nproc} ranks; pick 0..{nproc - 1}")
    return check_timeout(timeout)


def script_path(code_or_path: str | os.PathLike, run_dir: Path, name: str) -> str:
    """The script the ranks run: a path as given (it must exist), or source code written to RUN_DIR/`name`."""
    if isinstance(code_or_path, os.PathLike) or (str(code_or_path).endswith(".py") and "\n" not in str(code_or_path)):
        if not Path(code_or_path).is_file():
            raise FileNotFoundError(f"no such script: {code_or_path}")
        return str(Path(code_or_path).resolve())
    script = run_dir / name
    script.write_text(str(code_or_path))
    return str(script)


def rank_environment(run_id: str, publish_dir: Path, timeout: float | None, env: dict[str, str] | None = None,
                     backend: str | None = None) -> dict[str, str]:
    """The ranks' environment: this process's, then `env`, then what the launcher must set."""
    collective_s = DEFAULT_TIMEOUT_S if timeout is None else min(DEFAULT_TIMEOUT_S, 0.75 * timeout)
    ranks = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
             PUBLISH_DIR_ENV: str(publish_dir), TIMEOUT_ENV: str(collective_s), processes.RUN_ENV: run_id,
             processes.LAUNCHER_ENV: processes.identity(os.getpid()) or ""}
    if os.path.exists("/sys/class/net/lo"):  # Gloo's own sockets on loopback too (single node)
        ranks.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if backend is not None:
        ranks[BACKEND_ENV] = backend
    return ranks
