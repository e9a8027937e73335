"""CommTracer: record every collective and point-to-point call a run makes through ``torch.distributed``.

Inside ``with CommTracer() as tracer:`` each call becomes one frozen :class:`CommRecord`: op name, payload
``bytes`` S, group (size, global ranks), peer or root, step index, label, and the bytes *this* rank sends
(``sent``) and receives (``received``) under the ring cost model of `comm.costs`.

``received`` mirrors ``sent`` for the symmetric collectives. An ``*_object`` call (all_gather_object, ...) is
one record under its own name, summing the tensor collectives it makes inside; ``batch_isend_irecv`` gives one
``isend``/``irecv`` record per ``P2POp``; any other nested call (reduce_scatter_tensor → reduce_scatter_single)
counts once, as the outer op.

    tracer = CommTracer()
    with tracer:
        for x, y in batches:
            with tracer.label("backward"):
                loss_fn(ddp(x), y).backward()     # DDP with traced_allreduce_hook: recorded
            tracer.step()                         # end of a training step
            with tracer.paused():
                dist.all_reduce(loss)             # loss reporting is not the step's traffic
        tracer.summary(per_step=True)             # {"all_reduce": {"calls": 1, "bytes": 2704}}
        tracer.merge(per_step=True)               # every rank's summary and the rank that sends most

How: entering patches the functions of ``torch.distributed`` and of ``torch.distributed.distributed_c10d``
(all_gather_object reaches all_gather through the latter's globals); exiting puts back exactly what was there,
also on an exception. It cannot see collectives made in C++ (PyTorch DDP's bucket all-reduce: register
:func:`comm.ddp_hook.traced_allreduce_hook`), functional collectives (DTensor, FSDP2: ``comm.adapters``), nor a
function bound by
``from torch.distributed import all_reduce`` before entering. The patch is process-wide, so one tracer is active
per process: entering a second raises. No timings: an async op returns before its bytes move.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from dataclasses import dataclass, field

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from partrain_edu.comm.costs import COSTS, Group, group_of
from partrain_edu.comm.patch import patch_collectives, restore

__all__ = ["CommRecord", "CommTracer"]


@dataclass(frozen=True)
class CommRecord:
    op: str                      # name of the torch.distributed function called
    bytes: int                   # payload S the cost formula is applied to
    sent: int                    # bytes this rank sends under the ring cost model
    received: int                # bytes this rank receives under the same model
    group_size: int
    group_ranks: tuple[int, ...]  # global ranks, in group-rank order
    peer: int | None             # global rank of the other end (p2p) or of the root; else None
    step: int                    # index of the training step (number of tracer.step() calls before it)
    label: str | None            # innermost tracer.label(...) active at the call


# Recorded once under their own name, with the sum of the collectives they make inside.
_COMPOSITE = ("all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
              "send_object_list", "recv_object_list")
_TRACED = (*COSTS, *_COMPOSITE, "batch_isend_irecv")

_local = threading.local()       # .frame: the traced call this thread is inside, if any
_WRAPPERS: dict = {}             # original function -> its wrapper: one wrapper per function, for ever


@dataclass
class _Frame:
    collect: bool                # keep the records of nested calls (composite ops, batch_isend_irecv)
    children: list = field(default_factory=list)


def _point_at_current(ops):
    """batch_isend_irecv tells a send from a receive by ``op.op is isend`` against the module global, which
    is our wrapper while a tracer is active. A P2POp built before (holding the original) is copied to point
    at whatever ``isend``/``irecv`` is now, so it keeps working. (One built inside a tracer and batched after
    it exits would not: torch's own batch_isend_irecv then compares against the original.)"""
    current = {"isend": c10d.isend, "irecv": c10d.irecv}
    out = []
    for p in ops:
        q = object.__new__(type(p))           # P2POp.__new__ re-checks op: copy the attributes instead
        q.__dict__.update(vars(p))
        q.op = current.get(getattr(p.op, "__name__", None), p.op)
        out.append(q)
    return out


def _wrap(name: str, orig):
    """The traced version of ``orig``: a leaf op records itself (nested calls are ignored), a composite op
    records the sum of its nested calls, batch_isend_irecv records each nested isend/irecv."""
    if getattr(orig, "_comm_traced", False) or orig in _WRAPPERS:
        return _WRAPPERS.get(orig, orig)
    sig = inspect.signature(orig)
    kind = "leaf" if name in COSTS else "expand" if name == "batch_isend_irecv" else "composite"

    @functools.wraps(orig)
    def traced(*args, **kwargs):
        if kind == "expand":
            args, kwargs = (_point_at_current(sig.bind(*args, **kwargs).arguments["p2p_op_list"]),), {}
        tracer, parent = CommTracer._active, getattr(_local, "frame", None)
        if tracer is None or tracer._paused or (parent is not None and not parent.collect):
            return orig(*args, **kwargs)      # not tracing, or nested in an op that counts for itself
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        g = None if kind == "expand" else group_of(a.get("group"))
        if kind != "expand" and g is None:
            return orig(*args, **kwargs)
        _local.frame = frame = _Frame(collect=kind != "leaf")
        try:
            result = orig(*args, **kwargs)    # cost after the call: a call torch rejects is not recorded
        finally:
            _local.frame = parent
        if kind == "leaf":
            records = [tracer._record(name, g, *COSTS[name](a, g))]
        elif kind == "expand":
            records = frame.children
        else:
            kids = frame.children
            peers = {r.peer for r in kids}
            records = [tracer._record(name, g, sum(r.bytes for r in kids), sum(r.sent for r in kids),
                                      sum(r.received for r in kids), peers.pop() if len(peers) == 1 else None)]
        (parent.children if parent is not None else tracer.records).extend(records)
        return result

    traced._comm_traced = True
    _WRAPPERS[orig] = traced
    return traced


class CommTracer:
    """Context manager recording the ``torch.distributed`` calls made inside it (see the module docstring)."""

    _active: CommTracer | None = None    # process-wide, like the patch (DDP hooks may run on another thread)

    def __init__(self):
        self.records: list[CommRecord] = []
        self._step = 0
        self._paused = 0
        self._labels = []
        self._saved = []

    def __enter__(self) -> CommTracer:
        if CommTracer._active is not None:
            raise RuntimeError("a CommTracer is already active in this process; tracers do not nest "
                               "(use tracer.label(...) or tracer.step() to split one trace)")
        self._saved = patch_collectives(_TRACED, _wrap)
        CommTracer._active = self
        return self

    def __exit__(self, *exc) -> bool:
        restore(self._saved)
        self._saved = []
        CommTracer._active = None
        return False

    @contextlib.contextmanager
    def paused(self):
        """Calls made inside are not recorded (loss reporting, merging summaries)."""
        self._paused += 1
        try:
            yield self
        finally:
            self._paused -= 1

    @contextlib.contextmanager
    def label(self, text: str):
        """Records made inside carry ``label=text`` (the innermost one when labels nest)."""
        self._labels.append(text)
        try:
            yield self
        finally:
            self._labels.pop()

    def step(self) -> int:
        """Mark the end of a training step. Returns the number of completed steps (also ``tracer.steps``)."""
        self._step += 1
        return self._step

    steps = property(lambda self: self._step)

    @classmethod
    def active(cls) -> CommTracer | None:
        """The tracer recording in this process, if any."""
        return cls._active

    def add(self, record: CommRecord) -> None:
        """Record communication the patch cannot see (DTensor's and FSDP2's functional collectives run in
        C++): an adapter builds the `CommRecord` with the same ring cost model. Ignored while paused."""
        if not self._paused:
            self.records.append(record)

    def _record(self, op, g: Group, payload, sent, received, peer) -> CommRecord:
        return CommRecord(op, payload, sent, received, g.n, g.ranks, peer, self._step,
                          self._labels[-1] if self._labels else None)

    def summary(self, per_step: bool = False) -> dict[str, dict[str, int]]:
        """``{op: {"calls": int, "bytes": int}}``; ``bytes`` are the bytes this rank sends (ring model).

        ``per_step=True`` averages over the completed steps (integer division of calls and bytes) and leaves
        out records made after the last ``step()``: they belong to a step that has not ended.
        """
        records, steps = self.records, 1
        if per_step:
            if self._step == 0:
                raise ValueError("no completed step: call tracer.step() at the end of each training step")
            steps = self._step
            records = [r for r in records if r.step < steps]
        totals: dict[str, dict[str, int]] = {}
        for r in records:
            t = totals.setdefault(r.op, {"calls": 0, "bytes": 0})
            t["calls"] += 1
            t["bytes"] += r.sent
        return {op: {"calls": t["calls"] // steps, "bytes": t["bytes"] // steps} for op, t in sorted(totals.items())}

    def total_sent(self, per_step: bool = False) -> int:
        """Bytes this rank sends, summed over ops (ring model), per step if asked."""
        return sum(t["bytes"] for t in self.summary(per_step).values())

    def traffic(self) -> dict[str, int]:
        """What this rank sent and received in bytes, over every record: ``{"sent": ..., "received": ...}``."""
        return {"sent": self.total_sent(), "received": sum(record.received for record in self.records)}

    def merge(self, per_step: bool = False, group=None) -> dict:
        """Every rank's summary, gathered with ``all_gather_object`` (not recorded), and the rank that sends
        most (ties: the lowest rank). Call it on every rank of ``group``. Returns
        ``{"per_rank": [{"rank", "sent", "summary"}, ...], "max_sender": {"rank", "sent", "summary"}}``
        with ``per_rank`` in group-rank order. Without a process group it returns this process as rank 0.
        """
        summary = self.summary(per_step)
        mine = {"rank": dist.get_rank() if dist.is_initialized() else 0,
                "sent": sum(t["bytes"] for t in summary.values()), "summary": summary}
        everyone = [mine]
        if dist.is_initialized():
            everyone = [None] * dist.get_world_size(group)
            with self.paused():
                dist.all_gather_object(everyone, mine, group=group)
        return {"per_rank": everyone, "max_sender": max(everyone, key=lambda d: (d["sent"], -d["rank"]))}

    def summary_of_max_sender(self, per_step: bool = True, group=None) -> dict[str, dict[str, int]]:
        """The per-step summary of the rank that sends most: the ``comm`` of ``partrain-edu train``."""
        return self.merge(per_step, group)["max_sender"]["summary"]
