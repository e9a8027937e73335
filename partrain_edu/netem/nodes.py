"""`TwoNodes`: run a script on two emulated nodes whose only link is a real, shaped network link.

    with netem.TwoNodes(rate="200mbit") as nodes:
        result = nodes.run("train.py", nproc_per_node=2, args=["--steps", "5"], timeout=120)

For each node, one torchrun in that node's namespace (`netem._node`), with the flags a learner types on two real
nodes (`nodes.command(n, K)` prints them) and GLOO_SOCKET_IFNAME=eth0, so that Gloo talks over the shaped veth
(ranks of one node reach each other on their own node). Each rank runs under `partrain_edu._rank`, as in
`%%torchrun`: its lines come back as `[node n rank k] ...`, a failure is one `TorchrunError` naming the rank
(`check=False`: the exit codes instead), `runtime.publish`ed values return, and on timeout, interrupt or a failed
node everything of the run is stopped. The rendezvous may use one fixed port: nothing else lives in the
namespaces, and their TCP stores are reachable from these two namespaces only.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from partrain_edu import _procs
from partrain_edu._diagnose import RANK_DEBUG_ENV, TorchrunInterrupted, failure, timeout_error
from partrain_edu.launch import DEFAULT_RUN_TIMEOUT_S, KILL_GRACE_S, RANK_LINE, _Run, check_timeout
from partrain_edu.netem import links
from partrain_edu.runtime import DEFAULT_TIMEOUT_S, PUBLISH_DIR_ENV, TIMEOUT_ENV

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
        """The command a learner types on real node `node`; `run` starts the same with `partrain_edu._rank`."""
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
            (run_dir / "argv.json").write_text(json.dumps([_target(script, run_dir), *map(str, args)]))
            collector = _Collector(_Run(2 * nproc_per_node, run_dir, lambda rank, text: None, None), echo)
            collective_timeout = DEFAULT_TIMEOUT_S if timeout is None else min(DEFAULT_TIMEOUT_S, 0.75 * timeout)
            rank_env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                        "GLOO_SOCKET_IFNAME": links.INTERFACE, PUBLISH_DIR_ENV: str(run_dir / "published"),
                        TIMEOUT_ENV: str(collective_timeout), _procs.RUN_ENV: collector.run.run_id,
                        _procs.LAUNCHER_ENV: _procs.identity(os.getpid()) or ""}
            for name, value in RANK_DEBUG_ENV.items():
                rank_env.setdefault(name, value)
            commands = [[sys.executable, "-m", "partrain_edu.netem._node", str(os.getpid()), f"node{n}", ns,
                         *self._flags(n, nproc_per_node), "-m", "partrain_edu._rank", str(run_dir)]
                        for n, ns in enumerate(built.namespaces)]
            returncodes, wall_s, timed_out = _supervise(commands, rank_env, collector, timeout)
            run = collector.finish()
            if timed_out:
                raise timeout_error(run, timeout)
            if check and any(returncodes.values()):
                raise failure(run, next(code for code in returncodes.values() if code))
            published = {}
            for path in sorted((run_dir / "published").glob("*.pkl")):
                with open(path, "rb") as f:
                    published[path.stem] = pickle.load(f)
            return NodesResult(returncodes, run.texts(), dict(collector.node_of),
                               {n: "\n".join(lines) for n, lines in collector.node_lines.items()}, published, wall_s)


def _target(script: str | os.PathLike, run_dir: Path) -> str:
    if isinstance(script, os.PathLike) or (str(script).endswith(".py") and "\n" not in str(script)):
        if not Path(script).is_file():
            raise FileNotFoundError(f"no such script: {script}")
        return str(Path(script).resolve())
    path = run_dir / "script.py"
    path.write_text(str(script))
    return str(path)


class _Collector:
    """Both nodes' output, line by line from two reader threads: rank lines into the launcher's `_Run` (and
    echoed with their node), torchrun's own lines kept per node."""

    def __init__(self, run: _Run, echo: Echo | None):
        self.run, self.echo = run, echo
        self.node_of: dict[int, int] = {}
        self.node_lines: dict[int, list[str]] = {0: [], 1: []}
        self.lock = threading.Lock()
        self.readers: list[tuple[threading.Thread, Any]] = []

    def read(self, node: int, pipe: Any) -> None:
        thread = threading.Thread(target=self._pump, args=(node, pipe), daemon=True, name=f"netem-node{node}")
        thread.start()
        self.readers.append((thread, pipe))

    def _pump(self, node: int, pipe: Any) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            with self.lock:
                match = RANK_LINE.match(line)
                if match is None:
                    self.node_lines[node].append(line)
                    continue
                self.node_of[int(match.group(1))] = node
                self.run.take(line)
                if self.echo is not None:
                    self.echo(node, int(match.group(1)), match.group(2))

    def finish(self) -> _Run:
        """Wait for what is left in the pipes (a few seconds at most), then hand over the run. torchrun's reports
        go to `run.launcher` node by node: its two-line failure blocks must not interleave."""
        for thread, pipe in self.readers:
            thread.join(KILL_GRACE_S)
            if not thread.is_alive():  # else a process nobody could kill still holds it: leave it to the thread
                pipe.close()
        with self.lock:
            self.run.launcher = [*self.node_lines[0], *self.node_lines[1]]
        return self.run


def _supervise(commands: list[list[str]], env: dict[str, str], collector: _Collector,
               timeout: float | None) -> tuple[dict[int, int], float, bool]:
    """Start both nodes; wait until both exit, one failed and the other had FAILED_NODE_GRACE_S to follow, or
    time is up; then stop every process of the run, whatever happened (a KeyboardInterrupt included)."""
    start = time.perf_counter()
    deadline = None if timeout is None else start + timeout
    procs: list[subprocess.Popen] = []
    timed_out, failed_at = False, None
    try:
        for n, command in enumerate(commands):
            # A session of its own: Ctrl-C reaches only the launcher, which then stops the run itself.
            proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            procs.append(proc)
            collector.read(n, proc.stdout)
        while any(p.poll() is None for p in procs):
            now = time.perf_counter()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now
            if deadline is not None and now >= deadline:
                timed_out = True
                break
            if failed_at is not None and now - failed_at > FAILED_NODE_GRACE_S:
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs, collector.run.run_id)
        raise TorchrunInterrupted(collector.run.nproc, time.perf_counter() - start, collector.run.texts()) from None
    finally:
        _stop(procs, collector.run.run_id)
    return {n: p.returncode for n, p in enumerate(procs)}, time.perf_counter() - start, timed_out


def _stop(procs: list[subprocess.Popen], run_id: str) -> None:
    """SIGTERM, then SIGKILL after KILL_GRACE_S, to every process of the run, found by its PARTRAIN_RUN_ID."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    _procs.stop(lambda: _procs.run_members(run_id), KILL_GRACE_S)
    for proc in procs:
        try:
            proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
