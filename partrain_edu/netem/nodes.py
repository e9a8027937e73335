"""`TwoNodes`: run a script on two emulated nodes whose only link is a real, shaped network link.

    with netem.TwoNodes(rate="200mbit") as nodes:
        result = nodes.run("train.py", nproc_per_node=2, args=["--steps", "5"], timeout=120)

For each node, one torchrun in that node's namespace (`netem._node`), with the flags a learner types on two real
nodes (`nodes.command(n, K)` prints them) and GLOO_SOCKET_IFNAME=eth0, so that Gloo talks over the shaped veth
(ranks of one node reach each other on their own node). Each rank runs under `launcher.rank`, as in
`%%torchrun`: its lines come back as `[node n rank k] ...` (ranks 0..K-1 are node 0's: the c10d rendezvous orders
nodes by hostname), a failure is one `TorchrunError` naming the rank
(`check=False`: the exit codes instead), `runtime.publish`ed values return, and on timeout, interrupt or a failed
node everything of the run is stopped. The rendezvous may use one fixed port: nothing else lives in the
namespaces, and their TCP stores are reachable from these two namespaces only.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from partrain_edu.launcher import nanny
from partrain_edu.launcher.diagnose.oneshot import failure, mismatch_error, timeout_error
from partrain_edu.launcher.options import DEFAULT_RUN_TIMEOUT_S, check_timeout, rank_environment, script_path
from partrain_edu.launcher.output import Run
from partrain_edu.launcher.supervise import supervise
from partrain_edu.netem import links
from partrain_edu.runtime import read_published

PORT = 29500  # torchrun's default: free in a fresh namespace
FAILED_NODE_GRACE_S = 5.0  # after one node failed, the other's ranks see "connection closed" within this


class NetemUnavailable(RuntimeError):
    """This machine cannot build real shaped links (not root, no iproute2, ...)."""


def unavailable_message(reason: str) -> str:
    return (f"real shaped links are not available here: {reason}. The emulated links need none of it: "
            "runtime.init(device=\"emulated:a100,node=1,net=1gbe\") (one rank per emulated node)")


def check_available() -> None:
    ok, reason = links.available()
    if not ok:
        raise NetemUnavailable(unavailable_message(reason))


@dataclass
class NodesResult:
    returncodes: dict[int, int]      # node -> its torchrun's exit code
    outputs: dict[int, str]          # global rank -> everything it printed
    node_of: dict[int, int]          # global rank -> the node it ran on
    launcher_outputs: dict[int, str]  # node -> torchrun's own log lines
    published: dict[str, Any]
    wall_s: float


Echo = Callable[[int, int, str], None]


def _print_echo(node: int, rank: int, text: str) -> None:
    print(f"[node {node} rank {rank}] {text}", flush=True)


class TwoNodes:
    """Two namespaces, a veth pair limited to `rate` ('1gbit', '200mbit'; None: unshaped) each way, optionally
    `delay` ('0.1ms', needs the kernel's netem) in front; removed on exit, also after an error or a signal."""

    interface = links.INTERFACE

    def __init__(self, rate: str | None = "1gbit", delay: str | None = None):
        self.rate_bits, self.delay = links.parse_rate(rate), links.parse_delay(delay)
        check_available()
        self._links: links.Links | None = None
        self._saved_handlers: dict[int, Any] = {}

    @property
    def bytes_per_s(self) -> float | None:
        """The configured rate in bytes per second: β for `theory.traffic.collective_time` (None: unshaped).
        TCP's payload gets ~96% of it: tbf counts whole 1514-byte frames, of which 1448 bytes are payload."""
        return None if self.rate_bits is None else self.rate_bits / 8

    @property
    def namespaces(self) -> list[str]:
        return self._built().namespaces

    @property
    def addresses(self) -> list[str]:
        return self._built().addresses

    def _built(self) -> links.Links:
        if self._links is None:
            raise RuntimeError("use it as a context manager: `with netem.TwoNodes(...) as nodes: nodes.run(...)`")
        return self._links

    def __enter__(self) -> TwoNodes:
        if self._links is not None:
            raise RuntimeError("this TwoNodes is in use already: make another one for a second pair of nodes")
        self._links = links.Links(self.rate_bits, self.delay)
        self._catch_signals()
        try:
            self._links.create()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if self._links is not None:
                self._links.destroy()
                self._links = None
        finally:
            for signum, handler in self._saved_handlers.items():
                signal.signal(signum, handler)
            self._saved_handlers = {}

    def _catch_signals(self) -> None:
        """SIGTERM or SIGHUP (a closed terminal) would end Python without running __exit__: make them SystemExit
        while the links exist, where nobody else handles them (only possible on the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return

        def leave(signum: int, frame: Any) -> None:
            raise SystemExit(128 + signum)

        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is signal.SIG_DFL:
                self._saved_handlers[signum] = signal.signal(signum, leave)

    def command(self, node: int, nproc_per_node: int, script: str = "script.py") -> str:
        """The command a learner types on real node `node`; `run` starts the same with `launcher.rank`."""
        return " ".join(["torchrun", *self._flags(node, nproc_per_node), script])

    def _flags(self, node: int, nproc_per_node: int) -> list[str]:
        # --node-rank is ignored by the c10d rendezvous (torchrun says so): nodes are ordered by hostname.
        return ["--nnodes", "2", "--nproc-per-node", str(nproc_per_node), "--node-rank", str(node),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{self.addresses[0]}:{PORT}"]

    def run(self, script: str | os.PathLike, nproc_per_node: int = 1, args: Sequence[str] = (),
            timeout: float | None = DEFAULT_RUN_TIMEOUT_S, *, echo: Echo | None = _print_echo,
            env: dict[str, str] | None = None, check: bool = True) -> NodesResult:
        """Run `script` (a path, or source code) on `nproc_per_node` ranks per node: ranks 0..K-1 on node 0.
        `echo(node, rank, line)` sees each line live (None: quiet); `env` adds to the ranks' environment."""
        built = self._built()
        if isinstance(nproc_per_node, bool) or not isinstance(nproc_per_node, int) or nproc_per_node < 1:
            raise ValueError(f"nproc_per_node must be a whole number of at least 1, not {nproc_per_node!r}")
        if isinstance(args, (str, bytes)):
            raise ValueError(f"args must be a list of strings, such as ['--steps', '5'], not the string {args!r}")
        timeout = check_timeout(timeout)
        with tempfile.TemporaryDirectory(prefix="partrain_netem_") as tmp:
            run_dir = Path(tmp)
            (run_dir / "published").mkdir()
            (run_dir / "argv.json").write_text(json.dumps([script_path(script, run_dir, "script.py"),
                                                           *map(str, args)]))
            shown = (lambda rank, text: echo(rank // nproc_per_node, rank, text)) if echo else (lambda r, t: None)
            run = Run(2 * nproc_per_node, run_dir, shown, None)
            rank_env = {**rank_environment(run.run_id, run_dir / "published", timeout, env),
                        "GLOO_SOCKET_IFNAME": links.INTERFACE}   # Gloo over the shaped veth, not loopback
            # Each node's torchrun execs its workers (`-m`): each one a `launcher.nanny` that starts its rank.
            commands = [[sys.executable, "-m", "partrain_edu.netem._node", str(os.getpid()), f"node{n}", ns,
                         *self._flags(n, nproc_per_node), "-m", "partrain_edu.launcher.nanny", str(run_dir),
                         "partrain_edu.launcher.rank"] for n, ns in enumerate(built.namespaces)]
            outcome = supervise(lambda env: _start(commands, env, run_dir), rank_env, run, timeout,
                                failed_grace_s=FAILED_NODE_GRACE_S)
            lines = {n: (run_dir / f"node{n}.log").read_text(errors="replace").splitlines() for n in (0, 1)}
            run.launcher = [*lines[0], *lines[1]]  # torchrun's reports node by node
            if outcome.timed_out:
                raise timeout_error(run, timeout)
            if outcome.mismatch is not None:
                raise mismatch_error(run, outcome.mismatch)
            returncodes = dict(enumerate(outcome.returncodes))
            if check and any(returncodes.values()):
                raise failure(run, next(code for code in returncodes.values() if code))
            return NodesResult(returncodes, run.texts(), {r: r // nproc_per_node for r in range(run.nproc)},
                               {n: "\n".join(node_lines) for n, node_lines in lines.items()},
                               read_published(run_dir / "published"), outcome.wall_s)


def _start(commands: list[list[str]], env: dict[str, str], run_dir: Path) -> list[subprocess.Popen]:
    """Each node's torchrun, its own output (torchrun's logging) in RUN_DIR/node{n}.log."""
    nanny.write_env(run_dir, env)
    procs = []
    for n, command in enumerate(commands):
        with open(run_dir / f"node{n}.log", "wb") as log:
            procs.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
    return procs
