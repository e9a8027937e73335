"""Real shaped links (`partrain_edu.netem`): an all-reduce across two namespaces is correct, takes the time the α–β
model gives for the configured rate, and nothing (namespace, veth, hosts file, process) outlives a run, an
error, a timeout, an interrupt or a signal. Skipped, with the reason, where the machine does not allow it (the
checks of bad input and of the message without permission run everywhere)."""
import _thread
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from partrain_edu import netem
from partrain_edu.launcher import TorchrunError
from partrain_edu.netem import links
from partrain_edu.theory.traffic import LATENCY, collective_time
from test_launch import MARKER_ENV, leftovers, new_marker

OK, WHY = netem.available()
needs_root = pytest.mark.skipif(not OK, reason=WHY)
SIZE = 16 << 20  # 0.67 s at 200 Mbit/s: long enough that a loaded machine's jitter is small beside it

TIMED = f"""
import statistics, time, torch, torch.distributed as dist
from partrain_edu import runtime
ctx = runtime.init()
t = torch.tensor([float(ctx.rank + 1)])
dist.all_reduce(t)
big = torch.ones({SIZE // 4})
times = []
for _ in range(3):
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(big)
    times.append(time.perf_counter() - start)
assert big[0].item() == 8.0  # ones, summed over the 2 ranks three times
runtime.publish("result", {{"sum": t.item(), "seconds": statistics.median(times)}})
print("sum", t.item())
"""
FAILING = """
import sys, time, torch, torch.distributed as dist
from partrain_edu import runtime
ctx = runtime.init(timeout=10)
if sys.argv[1] == "raise" and ctx.rank == 1:
    raise ValueError("rank 1 has the wrong weights")
if sys.argv[1] == "sleep":
    time.sleep(600)
dist.all_reduce(torch.ones(4))
"""


def root_links() -> set[str]:
    listed = subprocess.run([links.IP, "-o", "link"], capture_output=True, text=True).stdout.splitlines()
    return {line.split(":")[1].strip() for line in listed}


def ours(pid: int = os.getpid()) -> list[str]:
    """Namespaces and hosts folders of TwoNodes made by process `pid`."""
    found = links.our_namespaces() + [p.name for p in links.HOSTS_DIR.glob(f"{links.PREFIX}*")]
    return [name for name in found if name.startswith(f"{links.PREFIX}{pid}-")]


@pytest.fixture
def nothing_left():  # every test using it needs root
    """The environment to run with; fails the test if a namespace, a hosts folder, a link in this machine's own
    namespace or a process marked with that environment is left behind."""
    before, (marker, env) = root_links(), new_marker()
    yield env
    assert ours() == []
    assert root_links() == before
    assert leftovers(marker) == []


@needs_root
def test_shaped_all_reduce_is_correct_and_takes_the_alpha_beta_time(nothing_left):
    with netem.TwoNodes(rate=None) as nodes:
        free = nodes.run(TIMED, timeout=60, echo=None, env=nothing_left).published["result"]
    with netem.TwoNodes(rate="200mbit") as nodes:
        lines = []
        result = nodes.run(TIMED, timeout=60, echo=lambda n, r, text: lines.append((n, r, text)), env=nothing_left)
        shaped = result.published["result"]
        assert nodes.command(1, 1) == ("torchrun --nnodes 2 --nproc-per-node 1 --node-rank 1 --rdzv-backend c10d "
                                       f"--rdzv-endpoint {nodes.addresses[0]}:29500 script.py")
    assert free["sum"] == shaped["sum"] == 3.0
    assert result.returncodes == {0: 0, 1: 0} and result.node_of == {0: 0, 1: 1}
    assert sorted(lines) == [(0, 0, "sum 3.0"), (1, 1, "sum 3.0")]
    model = collective_time("all_reduce", SIZE, 2, alpha=LATENCY["1gbe"], beta=200e6 / 8)
    print(f"16 MiB all_reduce: unshaped {free['seconds']:.3f} s, 200 Mbit/s {shaped['seconds']:.3f} s, "
          f"α–β model {model:.3f} s")
    assert shaped["seconds"] > 5 * free["seconds"]
    assert 0.5 < shaped["seconds"] / model < 2.0


@needs_root
def test_a_failing_rank_is_named_and_the_error_removes_everything(nothing_left):
    with pytest.raises(TorchrunError, match="rank 1 failed") as info:
        with netem.TwoNodes(rate="1gbit") as nodes:
            result = nodes.run(FAILING, args=["raise"], timeout=60, echo=None, env=nothing_left, check=False)
            assert result.returncodes[1] != 0 and "ValueError: rank 1 has the wrong" in result.outputs[1]
            nodes.run(FAILING, args=["raise"], timeout=60, echo=None, env=nothing_left)
    assert "ValueError: rank 1 has the wrong weights" in str(info.value)


@needs_root
def test_a_timeout_stops_every_process(nothing_left):
    with netem.TwoNodes(rate="1gbit") as nodes:
        start = time.perf_counter()
        with pytest.raises(TorchrunError, match="timed out after 10 s") as info:
            nodes.run(FAILING, args=["sleep"], timeout=10, echo=None, env=nothing_left)
        assert info.value.timed_out and time.perf_counter() - start < 20
        assert leftovers(nothing_left[MARKER_ENV]) == []  # stopped by run itself, with the links still up


@needs_root
def test_an_interrupt_stops_every_process(nothing_left):
    timer = threading.Timer(6.0, _thread.interrupt_main)  # the notebook's stop button
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        with netem.TwoNodes(rate="1gbit") as nodes:
            nodes.run(FAILING, args=["sleep"], timeout=60, echo=None, env=nothing_left)
    timer.cancel()


HOLDER = ("import time\nfrom partrain_edu import netem\nwith netem.TwoNodes() as nodes:\n"
          "    print(*nodes.namespaces, flush=True)\n    time.sleep(60)\n")


@needs_root
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_owner_leaves_nothing_once_the_next_run_starts(sig):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    names = holder.stdout.readline().split()
    assert len(names) == 2 and set(names) <= set(links.our_namespaces())
    holder.send_signal(sig)
    holder.wait(10)
    if sig == signal.SIGKILL:  # no chance to clean up: the next TwoNodes removes what a dead owner left
        assert set(names) <= set(links.our_namespaces())
        with netem.TwoNodes():
            pass
    assert ours(holder.pid) == []


@needs_root
def test_delay_needs_netem_and_says_so_when_the_kernel_lacks_it(nothing_left):
    try:
        with netem.TwoNodes(rate="1gbit", delay="1ms") as nodes:
            shown = subprocess.run([links.TC, "-n", nodes.namespaces[0], "qdisc", "show", "dev", "eth0"],
                                   capture_output=True, text=True).stdout
            assert "netem" in shown and "delay 1ms" in shown and "tbf" in shown
    except links.LinkError as error:
        assert "no netem qdisc (CONFIG_NET_SCH_NETEM)" in str(error) and "delay=None" in str(error)


@pytest.mark.parametrize("kwargs, words", [
    ({"rate": "1gbps"}, "rate must be bits per second"), ({"rate": "0mbit"}, "rate must be"),
    ({"rate": True}, "rate must be"), ({"rate": "2e11"}, "rate must be"),
    ({"delay": "1 hour"}, "delay must be a time"), ({"delay": "5s"}, "up to 1 s")])
def test_bad_settings_are_one_line_errors(kwargs, words):
    with pytest.raises(ValueError, match=words) as info:
        netem.TwoNodes(**kwargs)
    assert "\n" not in str(info.value)


@needs_root
def test_bad_run_arguments_are_one_line_errors(nothing_left, tmp_path):
    with netem.TwoNodes() as nodes:
        with pytest.raises(RuntimeError, match="in use already"):
            nodes.__enter__()
        for kwargs, words in [({"nproc_per_node": 0}, "nproc_per_node must be"),
                              ({"timeout": -1}, "timeout must be a positive"), ({"args": "--steps 5"}, "a list")]:
            with pytest.raises(ValueError, match=words):
                nodes.run("print(1)", **kwargs)
        with pytest.raises(FileNotFoundError, match="no such script"):
            nodes.run(str(tmp_path / "missing.py"))
    with pytest.raises(RuntimeError, match="use it as a context manager"):
        nodes.run("print(1)")


def test_without_permission_every_entry_point_names_the_emulated_fallback(monkeypatch):
    monkeypatch.setattr(links, "available", lambda: (False, "it needs root"))
    with pytest.raises(netem.NetemUnavailable) as info:
        netem.TwoNodes()
    assert str(info.value).startswith("real shaped links are not available here: it needs root.")
    assert 'runtime.init(device="emulated:a100,node=1,net=1gbe")' in str(info.value)
