"""The network of two emulated nodes: two network namespaces joined by a veth pair, shaped with `tc`.

    links = Links(rate_bits=200e6, delay=None); links.create(); ...; links.destroy()   (netem.TwoNodes does this)

Each namespace holds `lo` and one end of the veth, called eth0 as on a real node, with an address of a private
/30; tbf limits what leaves either end to `rate` (full duplex: each direction has its own bucket), and netem
adds `delay` in front of it where the kernel has netem. /etc/netns/NAME/hosts (which `ip netns exec` mounts over
/etc/hosts) names the ends node0 and node1. Names hold the owner's pid and start time, so concurrent runs never
collide and a later run removes what a killed one left (`remove_stale`).
"""
from __future__ import annotations

import functools
import ipaddress
import itertools
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from partrain_edu.launcher import processes

PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])  # ip and tc live in sbin
IP, TC = shutil.which("ip", path=PATH), shutil.which("tc", path=PATH)
PREFIX = "partrain-"
NAME = re.compile(rf"^{PREFIX}(\d+)-(\d+)-\d+-node[01]$")
HOSTS_DIR = Path("/etc/netns")
INTERFACE = "eth0"
POOL = ipaddress.ip_network("10.199.0.0/16")  # /30s are drawn from here at random and checked against `ip`
MTU = 1500  # Ethernet's, as between two real nodes
# tbf's bucket: at least one 64 KiB GSO packet (tbf must cut bigger ones into segments, tbf_segment in
# net/sched/sch_tbf.c), and the tokens of 2 ms, so that a late timer on a loaded machine loses none (tc-tbf(8):
# "the minimum buffer size can be calculated by dividing the rate by HZ"; HZ = 250 gives 4 ms, but the qdisc
# watchdog is a high-resolution timer). Small next to the MiB messages being timed: the first burst bytes after
# an idle moment go at the veth's own speed.
MIN_BURST_BYTES, BURST_S = 64 * 1024, 0.002
# tbf's queue: packets that wait longer are dropped. A switch-like 20 ms: TCP fills whatever queue there is, and
# drops cost retransmits (at least 200 ms each when they time out) that would swamp the timings; at 200 Mbit/s
# 5, 20 and 50 ms all gave the same 191 Mbit/s of TCP payload on this machine.
QUEUE_LATENCY = "20ms"
CAP_NET_ADMIN, CAP_SYS_ADMIN = 12, 21  # <linux/capability.h>; ip netns exec mounts, so it needs SYS_ADMIN too


class LinkError(RuntimeError):
    """An `ip`/`tc` command failed while building the links."""


def _cmd(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[0]
        raise LinkError(f"`{' '.join(args)}` failed: {said}")
    return done.stdout


RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}  # tc's own units; its "mbps" means megabytes


def parse_rate(rate: str | float | None) -> int | None:
    """'1gbit', '200mbit', '500kbit' (or a number of bits per second) → bits per second; None: unshaped."""
    if rate is None:
        return None
    number = r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*(bit|kbit|mbit|gbit)?\s*"
    match = None if isinstance(rate, bool) else re.fullmatch(number, str(rate).lower())
    bits = float(match[1]) * RATE_UNITS[match[2] or "bit"] if match else 0.0
    if not 1e5 <= bits <= 1e11:
        raise ValueError(f"rate must be bits per second between 100kbit and 100gbit, such as '1gbit' or '200mbit' "
                         f"(None: unshaped), not {rate!r} (tc's 'mbps' would mean megabytes)")
    return int(bits)


def parse_delay(delay: str | None) -> str | None:
    """'0.1ms', '100us', '2ms' → the same, checked; None: no delay."""
    if delay is None:
        return None
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*", str(delay))
    if not match or not 0 < float(match.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[match.group(2)] <= 1:
        raise ValueError(f"delay must be a time up to 1 s such as '0.1ms' or '100us' (None: no delay), not {delay!r}")
    return match.group(1) + match.group(2)


def _seconds(delay: str) -> float:
    number, unit = re.fullmatch(r"([\d.]+)(us|ms|s)", delay).groups()
    return float(number) * {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]


class Links:
    """Two namespaces, one shaped veth between them. `create()` builds everything or nothing; `destroy()` removes
    all of it, the processes inside first, and may be called any number of times."""

    _counter = itertools.count(1)  # next() on it is atomic: two threads never get the same number

    def __init__(self, rate_bits: int | None, delay: str | None):
        self.rate_bits, self.delay = rate_bits, delay
        pid = os.getpid()
        owner, number = (processes.identity(pid) or f"{pid}:0").replace(":", "-"), next(Links._counter)
        self.namespaces = [f"{PREFIX}{owner}-{number}-node{n}" for n in (0, 1)]
        self.addresses: list[str] = []
        self._made: list[str] = []

    def create(self) -> None:
        remove_stale()
        network = _free_subnet()
        self.addresses = [str(host) for host in network.hosts()]
        try:
            for ns in self.namespaces:
                _cmd(IP, "netns", "add", ns)
                self._made.append(ns)
            # Each end is created inside its namespace: nothing ever appears in this machine's own `ip link`.
            _cmd(IP, "link", "add", INTERFACE, "netns", self.namespaces[0], "mtu", str(MTU), "type", "veth",
                 "peer", "name", INTERFACE, "netns", self.namespaces[1], "mtu", str(MTU))
            for n, ns in enumerate(self.namespaces):
                _cmd(IP, "-n", ns, "link", "set", "lo", "up")
                _cmd(IP, "-n", ns, "addr", "add", f"{self.addresses[n]}/{network.prefixlen}", "dev", INTERFACE)
                _cmd(IP, "-n", ns, "link", "set", INTERFACE, "up")
                self._shape(ns)
                hosts = HOSTS_DIR / ns
                hosts.mkdir(parents=True, exist_ok=True)
                (hosts / "hosts").write_text(_hosts(self.addresses))
        except BaseException:
            self.destroy()
            raise

    def _shape(self, ns: str) -> None:
        qdisc = [TC, "-n", ns, "qdisc", "add", "dev", INTERFACE]
        parent = ["root"]
        if self.delay is not None:
            # netem first, tbf as its child: the Linux Foundation netem wiki's "Rate control" recipe. Its queue
            # must hold what is in flight during the delay (default 1000 packets).
            in_flight = (self.rate_bits or 10e9) / 8 * _seconds(self.delay) / MTU  # unshaped: ~8 Gbit/s here
            try:
                _cmd(*qdisc, "root", "handle", "1:", "netem", "delay", self.delay, "limit",
                     str(max(1000, int(2 * in_flight))))
            except LinkError as error:
                if "unknown" not in str(error):
                    raise
                raise LinkError("this kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), which delay= needs: leave "
                                "delay=None (tbf alone limits the rate)") from None
            parent = ["parent", "1:1", "handle", "10:"]
        if self.rate_bits is not None:
            burst = max(MIN_BURST_BYTES, int(self.rate_bits / 8 * BURST_S))
            _cmd(*qdisc, *parent, "tbf", "rate", f"{self.rate_bits}bit", "burst", str(burst),
                 "latency", QUEUE_LATENCY)

    def destroy(self) -> None:
        for ns in self._made:
            _remove(ns)
        self._made = []


def _hosts(addresses: list[str]) -> str:
    """node0 and node1, also as the IPv4-mapped IPv6 addresses under which torch's dual-stack TCPStore sees its
    peers: without them c10d's reverse lookup asks DNS, which no namespace reaches, and every rank warns "The
    hostname of the client socket cannot be retrieved"."""
    names = [f"{prefix}{address} node{n}" for n, address in enumerate(addresses) for prefix in ("", "::ffff:")]
    return "\n".join(["127.0.0.1 localhost", "::1 localhost", *names]) + "\n"


def _remove(ns: str) -> None:
    """Kill what runs inside `ns`, delete it (its veth end, and so the pair, goes with it) and its hosts file."""
    for _ in range(40):  # 2 s: a process in the middle of exiting holds the namespace a moment longer
        found = subprocess.run([IP, "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        procs = [p for p in map(processes.read, map(int, found)) if p is not None]
        if not procs:
            break
        processes.signal_each(procs, 9)
        time.sleep(0.05)
    subprocess.run([IP, "netns", "del", ns], capture_output=True)
    shutil.rmtree(HOSTS_DIR / ns, ignore_errors=True)


def our_namespaces() -> list[str]:
    listed = subprocess.run([IP, "netns", "list"], capture_output=True, text=True).stdout.splitlines()
    return [line.split()[0] for line in listed if line and NAME.match(line.split()[0])]


def remove_stale() -> list[str]:
    """Remove the namespaces (and hosts files) of runs whose process is gone: killed before it could clean up."""
    names = set(our_namespaces()) | {p.name for p in HOSTS_DIR.glob(f"{PREFIX}*")}
    stale = sorted(ns for ns in names if (m := NAME.match(ns)) and not processes.is_running(f"{m[1]}:{m[2]}"))
    for ns in stale:
        _remove(ns)
    return stale


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of POOL that no address or route of this machine, nor another run's namespace, overlaps. (The
    namespaces are isolated, so an overlap would misroute nothing; avoiding it keeps `ip addr` unambiguous.)"""
    texts = [_cmd(IP, "-4", "-o", "addr"), _cmd(IP, "-4", "route")]
    texts += [subprocess.run([IP, "-n", ns, "-4", "-o", "addr"], capture_output=True, text=True).stdout
              for ns in our_namespaces()]
    used = [ipaddress.ip_network(found, strict=False)
            for found in re.findall(r"\b(\d+\.\d+\.\d+\.\d+(?:/\d+)?)", "\n".join(texts))]
    subnets = list(POOL.subnets(new_prefix=30))
    for _ in range(100):
        candidate = random.choice(subnets)
        if not any(candidate.overlaps(net) for net in used):
            return candidate
    raise LinkError(f"no free /30 in {POOL} after 100 tries: remove old namespaces (`ip netns list`)")


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    """(True, "") where this machine can build the links, else (False, why not)."""
    if not sys.platform.startswith("linux"):
        return False, "network namespaces are Linux only"
    if IP is None or TC is None:
        return False, "the `ip` and `tc` commands (iproute2) are not installed"
    try:
        with open("/proc/self/status") as f:
            caps = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    except (OSError, StopIteration, ValueError):
        return False, "cannot read this process's capabilities from /proc/self/status"
    if not (caps >> CAP_NET_ADMIN & 1 and caps >> CAP_SYS_ADMIN & 1):
        return False, "it needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) to create network namespaces"
    probe = Links(rate_bits=1_000_000_000, delay=None)
    try:
        probe.create()
    except (LinkError, OSError, subprocess.SubprocessError) as error:
        return False, f"creating two namespaces and a shaped veth failed: {error}"
    finally:
        probe.destroy()
    return True, ""
