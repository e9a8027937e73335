"""Emulated links: every torch.distributed call costs steps·α + bytes/β on the rank's emulated clock.

Cost: k·(α per ring step + CommTracer's ring-model bytes this rank sends (costs.py) × the byte scale / β), on
the links of the ranks involved, (α, β) from `Emulator.link_of` (`theory.network`, as the model prices it); ring
steps: 2(n−1) for an all-reduce, n−1 for the others, 1 for a send; the byte scale and k from
`Emulator.scale_of` (k = 1 unless a traffic rule says one message stands for k layers'). Each rank has one
communication stream, in issue order, as NCCL's. Timing travels beside the data on a side group:
- a collective starts when the last rank has issued it (an all-reduce MAX of the issue times) and the stream is
  free; a blocking one moves the clock to its end, an async one's `wait()` does — so a bucket all-reduced during
  backward overlaps the rest of backward, as in DDP;
- a send leaves on the stream (the sender's clock moves only for a blocking `send`) and its arrival time goes to
  the receiver, whose clock moves to it when the receive completes. A receive from any source carries no time.
Calls inside another patched call or inside `batch_isend_irecv`'s coalescing are not charged separately.
"""
from __future__ import annotations

import collections
import functools
import inspect
import threading
import time

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from partrain_edu.comm import costs
from partrain_edu.comm.patch import patch_collectives, restore

_active = None                     # the installed Emulator (one per process, like the patch)
_side = None                       # the process group the timestamps travel on
_saved: list = []                  # (module, name, original)
_orig: dict = {}                   # name -> original function (the side group's calls use these)
_local = threading.local()         # .inside: a patched call is running on this thread
_pending: collections.deque = collections.deque()   # async collectives not yet resolved, in issue order
_sends: list = []                  # side sends in flight, kept alive until done
SENDS, RECEIVES = ("send", "isend"), ("recv", "irecv")


def _steps(name: str, n: int) -> int:
    if n == 1 or name in RECEIVES:
        return 0
    if name in SENDS:
        return 1
    return 2 * (n - 1) if name.startswith("all_reduce") else n - 1


def cost_of(emulator, name: str, arguments: dict, group) -> float:
    """Emulated-clock seconds this call occupies the stream (0 for a receive or a one-rank group)."""
    payload, sent, received, peer = costs.COSTS[name](arguments, group)
    ranks = (group.rank, peer) if name in SENDS else group.ranks
    _, alpha, beta = emulator.link_of(ranks)
    per_byte, messages = emulator.scale_of("p2p" if name in SENDS + RECEIVES else "collective", group.ranks)
    return messages * (_steps(name, group.n) * alpha + sent * per_byte / beta) * emulator.scale


def _occupy(emulator, ready: float, cost: float) -> float:
    """The stream runs `cost` once `ready` and idle; returns when that ends (emulated clock)."""
    with emulator.lock:
        end = max(ready, emulator.stream_free) + cost
        emulator.stream_free = end
        emulator.comm_s += cost
    return end


def _latest(t: float, async_op: bool = False):
    """All-reduce MAX of a time over every rank, on the side group: when the last rank got there."""
    box = torch.tensor([t], dtype=torch.float64)
    work = _orig["all_reduce"](box, op=dist.ReduceOp.MAX, group=_side, async_op=async_op)
    return (box, work) if async_op else box.item()


class CollectiveWork:
    """An async collective's work: `wait()` moves the clock to the op's emulated end."""

    def __init__(self, work, emulator, cost: float, issued: float):
        self.work = work
        self.emulator = emulator
        self.cost = cost
        self.end = None
        self.box, self.side = _latest(issued, async_op=True)
        _pending.append(self)

    def _resolve(self) -> None:
        while self.end is None:                    # earlier works first: the stream runs in issue order
            first = _pending.popleft()
            first.side.wait()
            first.end = _occupy(first.emulator, first.box.item(), first.cost)

    def wait(self, timeout=None) -> bool:
        self.work.wait() if timeout is None else self.work.wait(timeout)
        self._resolve()
        self.emulator.advance_to(self.end)
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed() and (self.end is not None or self.side.is_completed())

    def get_future(self) -> EmulatedFuture:
        return EmulatedFuture(self)

    def __getattr__(self, name):                   # result(), exception(): the real work's
        return getattr(self.work, name)


class EmulatedFuture:
    """`work.get_future()` of an emulated collective: `wait()` (and `then`'s callback) at the emulated end."""

    def __init__(self, work: CollectiveWork, callbacks: tuple = ()):
        self.work = work
        self.callbacks = callbacks
        self.result = None

    def then(self, callback) -> EmulatedFuture:
        return EmulatedFuture(self.work, (*self.callbacks, callback))

    def done(self) -> bool:
        return self.work.is_completed()

    def wait(self):
        self.work.wait()
        if self.result is None:
            future = self.work.work.get_future()
            future.wait()
            em = self.work.emulator
            with em.lock:   # a callback runs when the op ended (DDP's timeline reads the clock), not when waited on
                waited, em.clock = em.clock, self.work.end
            try:
                for callback in self.callbacks:    # each gets a completed future holding the previous result
                    value = callback(future)
                    future = torch.futures.Future()
                    future.set_result(value)
            finally:
                with em.lock:
                    em.clock = waited
            self.result = (future.value(),)
        return self.result[0]

    value = wait


class ReceiveWork:
    """A receive's work: `wait()` also takes the message's arrival time and moves the clock to it."""

    def __init__(self, work, emulator, src: int, tag: int):
        self.work, self.emulator = work, emulator
        self.box = torch.zeros(1, dtype=torch.float64)
        self.side = _orig["irecv"](self.box, src=src, group=_side, tag=tag)

    def wait(self, timeout=None) -> bool:
        self.work.wait() if timeout is None else self.work.wait(timeout)
        self.side.wait()
        self.emulator.advance_to(self.box.item())
        return True

    def __getattr__(self, name):
        return getattr(self.work, name)


def _call(emulator, name, orig, args, kwargs, a, group):
    cost = cost_of(emulator, name, a, group)
    issued = emulator.now()
    if name in SENDS:
        arrival = _occupy(emulator, issued, cost)
        box = torch.tensor([arrival], dtype=torch.float64)
        _sends[:] = [(w, b) for w, b in _sends if not w.is_completed()]
        _sends.append((_orig["isend"](box, dst=costs.peer(group, a["dst"], a["group_dst"]), group=_side,
                                      tag=a["tag"]), box))
        result = orig(*args, **kwargs)
        if name == "send":
            emulator.advance_to(arrival)
        return result
    result = orig(*args, **kwargs)
    if name in RECEIVES:
        src = costs.peer(group, a["src"], a["group_src"])
        if src is None:
            return result
        receive = ReceiveWork(result if name == "irecv" else _Done(), emulator, src, a["tag"])
        if name == "irecv":
            return receive
        receive.wait()
        return result
    if a.get("async_op"):
        return CollectiveWork(result, emulator, cost, issued)
    last = _latest(issued)
    emulator.synced(last)
    emulator.advance_to(_occupy(emulator, last, cost))
    return result


class _Done:
    def wait(self, timeout=None) -> bool:
        return True


def _wrap(name: str, orig):
    signature = inspect.signature(orig)

    @functools.wraps(orig)
    def emulated(*args, **kwargs):
        emulator = _active
        if emulator is None or getattr(_local, "inside", False) or c10d._world.pg_coalesce_state:
            return orig(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        group = costs.group_of(bound.arguments.get("group"))
        if group is None:
            return orig(*args, **kwargs)
        _local.inside = True
        try:
            return _call(emulator, name, orig, args, kwargs, bound.arguments, group)
        finally:
            _local.inside = False

    emulated._emulated = True
    return emulated


def install(emulator) -> None:
    """Patch torch.distributed's calls (and c10d's, which its *_object helpers use) for `emulator`, create the
    side group, and start every rank's clock at the same instant. Every rank must call it (a collective)."""
    global _active, _side
    uninstall()
    _saved.extend(patch_collectives(costs.COSTS, _wrap))
    for _, name, orig in _saved:
        _orig.setdefault(name, orig)
    _side = dist.new_group(backend="gloo")
    emulator.clock = emulator.stream_free = _latest(time.perf_counter())
    emulator.synced(emulator.clock)
    _active = emulator


def uninstall() -> None:
    global _active, _side
    restore(_saved)
    _saved.clear()
    _pending.clear()
    _sends.clear()
    _active = _side = None
