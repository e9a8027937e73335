"""Each rank's torchrun worker (a nanny, in ipyparallel's sense): it starts the rank, waits, keeps its exit code.

    elastic_launch(config, nanny.main)(RUN_DIR, WRAPPER)     (`launcher.start` on Linux: forked by the forkserver)
    python -m partrain_edu.launcher.nanny RUN_DIR WRAPPER     (`launcher.start` elsewhere; netem's torchrun)

1. It takes on the launch's environment and working directory (RUN_DIR/env.json) under torchrun's variables
   (RANK, WORLD_SIZE, MASTER_ADDR, ...), joins the run's cgroup (`cgroup`), starts a session of its own (the
   interrupt is the launcher's to pass on) and names itself for `ps` (`name`).
2. It points fds 1 and 2 at RUN_DIR/rank{k}.out (`output.Tail`): what the rank or any child of it writes is its.
3. It starts `WRAPPER.main([RUN_DIR])` (`launcher.rank`, `warm.rank_loop`): forked, where it holds torch already and
   the interpreter-level variables are its own (milliseconds, not seconds of imports), else exec'd afresh
   (`python -m partrain_edu.launcher.nanny --rank RUN_DIR WRAPPER`); either way through `rank_main`.
4. It passes SIGTERM and SIGINT on and saves the rank's exit code (negative: a signal) to RUN_DIR/rank{k}.exit:
   every failed rank's, not only the first that torch's agent saw (`exit_codes`); a rank's `os._exit(0)` is a
   clean finish, as an exec'd script's would be, where torch's forked workers would wait for ever.
"""
from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

from partrain_edu.launcher import cgroup, processes

# What torch's agent sets for each worker (torchrun's documented environment): it wins over the launch's copy.
TORCHRUN_ENV = ("LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
                "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCH_NCCL_ASYNC_ERROR_HANDLING")
# Variables Python, torch or their libraries read only when they start: a rank forked from a process that started
# with other values would not see the launch's. The thread count and torch's debug level are set anew after the
# fork instead (`rank_main`).
INTERPRETER_ENV = re.compile(r"^(PYTHON(?!UNBUFFERED$)|LD_|MALLOC|GLIBC|(OMP|MKL|KMP|GOMP|OPENBLAS)_(?!NUM_THREADS$)"
                             r"|PYTORCH_|CUDA|HIP_|ROCM|LANG$|LC_|TMPDIR$)")
ENV_FILE = "env.json"


def main(run_dir: str, wrapper: str) -> None:
    rank = int(os.environ["RANK"])
    inherited = dict(os.environ)
    with open(os.path.join(run_dir, ENV_FILE)) as f:
        launch = json.load(f)
    torchrun = {k: v for k, v in inherited.items() if k in TORCHRUN_ENV or k.startswith("TORCHELASTIC_")}
    env = {**launch["env"], **torchrun}
    os.environ.clear()
    os.environ.update(env)
    os.chdir(launch["cwd"])  # the launcher's now, not the forkserver's (where the kernel was at its first launch)
    name(f"partrain worker {rank} of {env['WORLD_SIZE']}")
    cgroup.join(env.get(cgroup.ENV))  # before the rank starts: all it starts stays in the run's cgroup
    with contextlib.suppress(OSError, AttributeError):  # exec'd by torch, it leads a session already; Windows
        os.setsid()
    write_whole(run_dir, f"rank{rank}.worker", processes.identity(os.getpid()) or "")
    out = os.open(os.path.join(run_dir, f"rank{rank}.out"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    if _read_at_start(env) == _read_at_start(inherited) and wrapper in sys.modules and hasattr(os, "fork"):
        code = _wait_forked(wrapper, run_dir)
    else:
        code = _wait_exec(wrapper, run_dir, env)
    write_whole(run_dir, f"rank{rank}.exit", str(code))
    if code:
        sys.exit(1)


def _read_at_start(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if INTERPRETER_ENV.match(k)}


def _wait_forked(wrapper: str, run_dir: str) -> int:
    pid = os.fork()
    if pid == 0:
        rank_main(run_dir, wrapper)
    _pass_on_signals(lambda sig: os.kill(pid, sig))
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _wait_exec(wrapper: str, run_dir: str, env: dict[str, str]) -> int:
    proc = subprocess.Popen([sys.executable, "-m", "partrain_edu.launcher.nanny", "--rank", run_dir, wrapper], env=env,
                            stdin=subprocess.DEVNULL)
    _pass_on_signals(proc.send_signal)
    return proc.wait()


def rank_main(run_dir: str, wrapper: str) -> NoReturn:
    """The rank, forked or exec'd: what torch read from the environment when it loaded (a forked rank's read the
    forkserver's), then `WRAPPER.main([RUN_DIR])`, then no interpreter teardown (it can abort while Gloo's threads
    finish)."""
    code = 1
    try:
        if (torch := sys.modules.get("torch")) is not None:
            if os.environ.get("OMP_NUM_THREADS", "").isdigit():
                torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
            if torch.distributed.is_available():
                torch.distributed.set_debug_level_from_env()
        for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED=1; an odd character never costs the rank its life
            stream.reconfigure(line_buffering=True, write_through=True, errors="backslashreplace")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if not os.environ.get("PYTHONFAULTHANDLER"):
            faulthandler.disable()  # torch's worker turned it on: a crash would print every thread's stack
        code = importlib.import_module(wrapper).main([run_dir])
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _pass_on_signals(send) -> None:
    # torch's agent stops a failed run's other workers with SIGTERM: the rank is what must stop.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: send(signum))


def write_env(run_dir: str | os.PathLike, env: dict[str, str]) -> None:
    """The launch's side: the ranks' environment and this working directory, for their workers (RUN_DIR is 0700)."""
    write_whole(run_dir, ENV_FILE, json.dumps({"env": env, "cwd": os.getcwd()}))


def name(title: str) -> None:
    """What `ps` shows: `title` and the run's id, not the forkserver's command line (SPT_NOENV: keep the environ)."""
    os.environ["SPT_NOENV"] = "1"
    import setproctitle

    run_id = os.environ.get(processes.RUN_ENV, "")
    setproctitle.setproctitle(f"{title} [run {run_id[:8]}]" if run_id else title)


def write_whole(run_dir: str | os.PathLike, name: str, text: str) -> None:
    """RUN_DIR/`name` holding `text`, whole or absent: the launcher may read at any moment, a rank die mid-write."""
    path = os.path.join(run_dir, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def rank_files(run_dir: str | os.PathLike, suffix: str) -> dict[int, Path]:
    """{k: RUN_DIR/rank{k}{suffix}} for every such file (.pid, .worker, .out, .exit, .error, .done, .calls)."""
    return {int(path.name[4:-len(suffix)]): path for path in Path(run_dir).glob(f"rank*{suffix}")}


def exit_codes(run_dir: str | os.PathLike) -> dict[int, int]:
    """{rank: exit code} of every rank whose worker saw it end (negative: the signal that killed it)."""
    codes = {}
    for rank, path in rank_files(run_dir, ".exit").items():
        with contextlib.suppress(ValueError, OSError):
            codes[rank] = int(path.read_text())
    return codes


def identities(run_dir: str | os.PathLike, suffix: str) -> dict[int, str]:
    """{rank: "pid:start"} from RUN_DIR/rank{k}.pid (the ranks) or .worker (their workers)."""
    found = {}
    for rank, path in rank_files(run_dir, suffix).items():
        with contextlib.suppress(OSError):
            if (ident := path.read_text().strip()).count(":") == 1:
                found[rank] = ident
    return found


def roots(run_dir: str | os.PathLike) -> list[str]:
    """The identities of the run's workers and ranks (forked, they show their parent's environment, not the run's
    id)."""
    return [*identities(run_dir, ".worker").values(), *identities(run_dir, ".pid").values()]


def members(run_dir: str | os.PathLike, run_id: str) -> list[processes.Proc]:
    """Every live process of the run: its workers and ranks, what carries the run's id, and their descendants."""
    return processes.run_members(run_id, roots(run_dir))


if __name__ == "__main__":  # a worker (torch's agent, spawned: RUN_DIR WRAPPER), or its rank (--rank RUN_DIR WRAPPER)
    (rank_main if sys.argv[1] == "--rank" else main)(*sys.argv[-2:])
