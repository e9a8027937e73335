"""The torchrun process of each launch (forked by `agent_server`, or started afresh): torch's own
`torch.distributed.run`, plus two things its command line cannot ask for.

    python -m partrain_edu.launcher.agent PARENT_PID [--preload=M,...] [torchrun options] \
        --log-dir=RUN_DIR/torchelastic --run-path --start-method=fork .../launcher/rank.py RUN_DIR (`rank_target`)

1. It dies with the launcher. PR_SET_PDEATHSIG has the kernel SIGKILL it as soon as its parent ends: the
   launcher thread that started it, blocked in `torchrun()` for the whole run (a warm pool, `launcher.warm.pool`,
   keeps a thread waiting on it), or the `agent_server`, which ends with the launcher and kills an agent whose
   launch hung up; however that ends (SIGTERM, SIGHUP from a closed terminal, the OOM killer).
   SIGKILL rather than SIGTERM: torchrun's own SIGTERM clean-up would kill the ranks before their watchdogs
   (`launcher.rank`) could kill what the ranks started in other sessions; the watchdogs notice the launcher
   is gone and kill the whole run.
2. Its stores listen on 127.0.0.1 only. torch's TCPStore server binds every interface whatever host it is given
   (`0.0.0.0` / `::` in TCPStoreLibUvBackend), and the rendezvous unpickles what it reads from its store: on a
   shared server that is an open door into the run. TCPStore takes an already-bound socket (`master_listen_fd`),
   so each server it starts here gets one bound to 127.0.0.1. The launcher passes `--local-addr 127.0.0.1` and a
   127.0.0.1 rendezvous endpoint so that the clients look for the servers there.
Also, before any rank starts, it joins the run's cgroup where the launcher could make one (`cgroup`).
The ranks are forked from this process (torchrun's `--run-path`: the script runs in workers started with
`--start-method`): torch, imported once here, is already in every rank, which saves each rank ~2 s of imports.
`--preload` imports more before the fork (`torch._dynamo`, which any torch optimizer imports on first use).
Forked ranks are polled as exec'd ones are: exit 0 finishes a rank, and a failure names every failed rank.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import socket
import sys
from typing import Sequence

from partrain_edu.launcher import cgroup, torchrun_main
from partrain_edu.launcher.processes import die_with_parent

_STORE_ARGS = ("world_size", "is_master", "timeout", "wait_for_workers", "multi_tenant", "master_listen_fd",
               "use_libuv")  # TCPStore's parameters after host_name and port, in order


def serve_on_loopback_only() -> None:
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    class LoopbackTCPStore(dist.TCPStore):
        def __init__(self, host_name: str, port: int, *args, **kwargs):
            kwargs.update(zip(_STORE_ARGS, args, strict=False))  # the positional ones given: a prefix of _STORE_ARGS
            if kwargs.get("is_master") and kwargs.get("master_listen_fd") is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.bind(("127.0.0.1", port))  # port 0: the OS picks a free one, so two launches never collide
                port = sock.getsockname()[1]
                kwargs["master_listen_fd"] = sock.detach()  # the store owns the socket from now on
            super().__init__(host_name, port, **kwargs)

    # Both places torchrun creates stores from: the rendezvous backend, and the store it shares with the ranks.
    dist.TCPStore = LoopbackTCPStore
    c10d_rendezvous_backend.TCPStore = LoopbackTCPStore


def command(run_id: str, nproc: int, module: str, run_dir: str, preload: Sequence[str] = ()) -> list[str]:
    """This process's command line for a one-node run of `nproc` ranks, each running the wrapper `module` on the
    run kept in `run_dir` (`rank_target`), on a fresh rendezvous on a free port of 127.0.0.1 (one-shot runs, warm
    pools)."""
    return [sys.executable, "-m", "partrain_edu.launcher.agent", str(os.getpid()),
            *([f"--preload={','.join(preload)}"] if preload else []), "--rdzv-backend=c10d",
            "--rdzv-endpoint=127.0.0.1:0", f"--rdzv-id={run_id}", "--nnodes=1", "--local-addr=127.0.0.1",
            f"--nproc-per-node={nproc}", *rank_target(module, run_dir)]


def rank_target(module: str, run_dir: str) -> list[str]:
    """The end of a torchrun command line that runs `module` (a wrapper such as `launcher.rank`) on every rank of
    the run kept in `run_dir`, in workers forked from torchrun's own process rather than started afresh (see
    above). torchrun's own files go there too, and go with it (by default each launch left one in /tmp)."""
    return [f"--log-dir={os.path.join(run_dir, 'torchelastic')}", "--run-path", "--start-method=fork",
            os.path.abspath(importlib.util.find_spec(module).origin), run_dir]


def poll_forked_ranks_as_exec_ones() -> None:
    """torchrun's fork path differs from its exec path in two ways, undone here. A rank that exits with 0 without
    returning (`os._exit(0)` in a script) has finished; the fork path alone would wait for its return value for
    ever. And a failure names every rank that had failed, not only the first one polled: a rank killed by a
    signal is the cause even when a peer's "connection closed" happened to be polled first (`diagnose.oneshot`)."""
    import signal

    from torch.distributed.elastic.multiprocessing import api

    poll = api.MultiprocessContext._poll

    def _poll(self):
        processes = self._pc.processes if self._pc is not None else []
        result = poll(self)
        if result is None and processes and all(
                rank in self._return_values or proc.exitcode == 0 for rank, proc in enumerate(processes)):
            for rank in range(self.nprocs):
                self._return_values.setdefault(rank, None)
            result = poll(self)  # now done: torchrun lets the waiting ranks go and reports success
        if result is not None and result.failures:
            # By now torchrun has stopped every survivor with SIGTERM: those are not failures of their own.
            for rank, proc in enumerate(processes):
                if rank not in result.failures and proc.exitcode not in (None, 0, -signal.SIGTERM):
                    result.failures[rank] = api.ProcessFailure(rank, proc.pid, proc.exitcode, self.error_files[rank])
        return result

    api.MultiprocessContext._poll = _poll


def main(argv: list[str]) -> None:
    die_with_parent(int(argv[0]))
    cgroup.join(os.environ.get(cgroup.ENV))  # before any rank starts: all they start stays in the run's cgroup
    rest = argv[1:]
    if rest[0].startswith("--preload="):
        for module in rest.pop(0).split("=", 1)[1].split(","):
            importlib.import_module(module)
    serve_on_loopback_only()
    poll_forked_ranks_as_exec_ones()
    torchrun_main.run(rest)  # raises when a rank failed, each failed rank's exit code saved
    # Every rank has been joined and torchrun's stores are closed: skip tearing down an interpreter that holds
    # torch (about 0.4 s, on every launch). Only what is buffered needs to go out first.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
