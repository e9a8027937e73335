"""The observations a multi-rank check's ranks publish: written on the ranks, read in the trusted caller.

On the ranks, the observe half writes plain JSON data: `tensor(t)` for a tensor, `traffic(tracer)` for the
collectives a CommTracer saw. The ranks run the learner's code, so what they publish may be anything: not
JSON, the wrong shape, strings for numbers, huge lists, NaN. `verify(spec, text, seed)` decodes the text with
`json.loads` only (nothing the ranks made is ever unpickled or evaluated), hands each rank's part to the check's
verify half, and words the verdict: the problems of the rank whose first problem arose earliest in the run (a
`registry.Problem` says when; else the lowest failing rank), naming the other ranks that failed too.
The verify halves read their rank's part through `Reader`, whose every accessor checks type, length and size and
raises `Malformed` — which becomes a one-line problem, never a traceback.
"""
from __future__ import annotations

import json
import math
from typing import Any

import torch
import torch.distributed as dist

from partrain_edu.grading.compare import NotATensor

MAX_TEXT_CHARS = 2**20  # the real observations are a few tens of kB
MAX_DIMS, MAX_NUMEL = 8, 2**20
MAX_VALUES = 4096  # the checks' tensors hold at most 256 values; a bigger one is reported by its shape alone


def tensor(value: Any) -> dict:
    """{"shape", "values"} for a tensor (values as floats), {"shape"} for a huge one, {"type"} for anything else."""
    if not isinstance(value, torch.Tensor):
        return {"type": type(value).__name__}
    if value.is_complex():
        return {"type": f"a complex tensor ({value.dtype})"}
    shape = list(value.shape)
    if value.numel() > MAX_VALUES:
        return {"shape": shape}
    return {"shape": shape, "values": value.detach().to("cpu", torch.float64).reshape(-1).tolist()}


def traffic(tracer) -> dict:
    """A CommTracer's calls: {"ops": {op: calls}, "sent": bytes sent under the ring model, "bytes": {op: payload
    bytes}, "peers": {op: [global ranks it talked to (p2p) or rooted at, sorted]}}."""
    ops: dict[str, int] = {}
    payload: dict[str, int] = {}
    peers: dict[str, set] = {}
    for r in tracer.records:
        ops[r.op] = ops.get(r.op, 0) + 1
        payload[r.op] = payload.get(r.op, 0) + r.bytes
        if r.peer is not None:
            peers.setdefault(r.op, set()).add(r.peer)
    return {"ops": ops, "sent": sum(r.sent for r in tracer.records), "bytes": payload,
            "peers": {op: sorted(ranks) for op, ranks in peers.items()}}


def group_bits(group) -> int:
    """A group's global ranks as bits (None: the default group), to compare the group a call used with the one it
    owed; 0 for anything that is not a group."""
    try:
        ranks = range(dist.get_world_size()) if group is None else dist.get_process_group_ranks(group)
        return sum(1 << r for r in ranks)
    except Exception:
        return 0


class Malformed(Exception):
    """The observations do not have the form the check's observe half writes; the message says where."""


class Reader:
    """Typed access to one rank's untrusted observations; every accessor raises Malformed on a surprise."""

    def __init__(self, value: Any, where: str = "observations"):
        self.value, self.where = value, where

    def __getitem__(self, key: str | int) -> "Reader":
        if isinstance(key, str):
            if not isinstance(self.value, dict) or key not in self.value:
                raise Malformed(f"{self.where} has no entry {key!r}")
            return Reader(self.value[key], f"{self.where}[{key!r}]")
        if not isinstance(self.value, list) or not 0 <= key < len(self.value):
            raise Malformed(f"{self.where} has no item {key}")
        return Reader(self.value[key], f"{self.where}[{key}]")

    def items(self, length: int) -> list["Reader"]:
        """The readers of a list that must have exactly `length` items."""
        if not isinstance(self.value, list) or len(self.value) != length:
            raise Malformed(f"{self.where} is not a list of {length} items")
        return [self[i] for i in range(length)]

    def entries(self, most: int, what: str = "items") -> list["Reader"]:
        """The readers of a list of at most `most` items (`what` names them in the error)."""
        if not isinstance(self.value, list) or len(self.value) > most:
            raise Malformed(f"{self.where} is not a list of at most {most} {what}")
        return [self[i] for i in range(len(self.value))]

    def records(self, fields: tuple[str, ...], most: int = 1000, what: str = "records") -> list[tuple]:
        """A list of at most `most` records, each a list of one value per field of `fields` ("name": a string
        of at most 80 characters; "count": a whole number ≥ 0; "peer": a rank or None), as tuples."""
        out = []
        for record in self.entries(most, what):
            row = []
            for kind, value in zip(fields, record.items(len(fields)), strict=True):
                if kind != "name":
                    row.append(None if kind == "peer" and value.value is None else value.count())
                elif isinstance(value.value, str) and len(value.value) <= 80:
                    row.append(value.value)
                else:
                    raise Malformed(f"{value.where} is not a name of at most 80 characters")
            out.append(tuple(row))
        return out

    def count(self) -> int:
        """A whole number ≥ 0 (not a bool, not a float)."""
        v = self.value
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**53:
            raise Malformed(f"{self.where} is not a whole number of at least 0: {_short(v)}")
        return v

    def numbers(self, most: int = 64) -> list[int]:
        """A list of at most `most` whole numbers ≥ 0 (ranks, positions)."""
        if not isinstance(self.value, list) or len(self.value) > most:
            raise Malformed(f"{self.where} is not a list of at most {most} numbers")
        return [self[i].count() for i in range(len(self.value))]

    def flags(self, most: int = 64) -> list[bool]:
        """A list of at most `most` booleans."""
        if not isinstance(self.value, list) or len(self.value) > most or \
                not all(isinstance(v, bool) for v in self.value):
            raise Malformed(f"{self.where} is not a list of at most {most} true/false values")
        return list(self.value)

    def keys(self) -> list[str]:
        """The names of a table of at most 64 entries with short names."""
        if not isinstance(self.value, dict) or len(self.value) > 64 or any(len(k) > 64 for k in self.value):
            raise Malformed(f"{self.where} is not a table of at most 64 short names")
        return list(self.value)

    def counts(self) -> dict[str, int]:
        """{name: count} with short names, as CommTracer's op tallies."""
        if not isinstance(self.value, dict) or len(self.value) > 64:
            raise Malformed(f"{self.where} is not a table of at most 64 counts")
        out = {}
        for name in self.value:
            if len(name) > 64:
                raise Malformed(f"{self.where} has a name over 64 characters")
            out[name] = self[name].count()
        return out

    def tensor(self) -> torch.Tensor | NotATensor:
        """The tensor written by `tensor`, or a NotATensor saying what was there instead."""
        v = self.value
        if not isinstance(v, dict):
            raise Malformed(f"{self.where} is not a tensor record")
        if "type" in v:
            if not isinstance(v["type"], str) or len(v["type"]) > 100:
                raise Malformed(f"{self.where} names no type")
            return NotATensor(v["type"])
        shape = v.get("shape")
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and
                all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_NUMEL for d in shape)):
            raise Malformed(f"{self.where} has no valid shape")
        numel = math.prod(shape)
        if numel > MAX_NUMEL:
            raise Malformed(f"{self.where} has a shape of over {MAX_NUMEL} values")
        if "values" not in v:  # the observe half leaves out a huge tensor's values: its shape is wrong anyway
            return NotATensor(f"a tensor of shape {tuple(shape)} (too large to report its values)")
        values = v["values"]
        if not isinstance(values, list) or len(values) != numel:
            raise Malformed(f"{self.where} does not hold {numel} values for shape {tuple(shape)}")
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in values):
            raise Malformed(f"{self.where} holds something that is not a number")
        try:
            return torch.tensor(values, dtype=torch.float64).reshape(shape)
        except (OverflowError, RuntimeError) as err:  # an int beyond float64's range
            raise Malformed(f"{self.where} holds a number out of range ({err})") from None


def _when(problem: str, rank: int) -> tuple:
    """The order in which failed ranks are told: the earliest `Problem.at` first (a plain string problem has no
    time and comes after those that do), then the lowest rank."""
    at = getattr(problem, "at", None)
    return (at is None or at == (), at or (), rank)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def decode(text: Any, nproc: int) -> list[Reader]:
    """One Reader per rank from the published JSON text; Malformed when it is not a list of `nproc` entries."""
    if not isinstance(text, str):
        raise Malformed(f"the ranks published a {type(text).__name__}, not JSON text")
    if len(text) > MAX_TEXT_CHARS:
        raise Malformed(f"the ranks published over {MAX_TEXT_CHARS // 2**20} MiB of observations")
    try:
        value = json.loads(text)
    except RecursionError:
        raise Malformed("the ranks published JSON nested too deeply") from None
    except ValueError as err:
        raise Malformed(f"the ranks published text that is not JSON ({getattr(err, 'msg', str(err))[:80]})") from None
    ranks = Reader(value, "the published report (one entry per rank)").items(nproc)
    return [Reader(r.value, f"rank {i}'s observations") for i, r in enumerate(ranks)]


def verify(spec, text: Any, seed: int) -> list[str]:
    """The learner-facing problems of rank check `spec` on the published observations `text` of the run drawn
    from `seed` (empty: passed)."""
    try:
        ranks = decode(text, spec.nproc)
    except Malformed as err:
        return [f"{err}; only the check publishes its observations: did your code call runtime.publish?"]
    report = {}
    for rank, reader in enumerate(ranks):
        try:
            report[rank] = spec.verify(rank, spec.nproc, reader, seed=seed)
        except Malformed as err:
            report[rank] = [f"malformed observations ({err}): did your code change what the check records?"]
        except Exception as err:  # data no accessor foresaw: still one line, never the grader's traceback
            report[rank] = [f"the observations could not be checked ({type(err).__name__}: {str(err)[:200]})"]
    failed = sorted((rank for rank, problems in report.items() if problems), key=lambda r: _when(report[r][0], r))
    if not failed:
        return []
    also = f" (rank(s) {failed[1:]} failed this check too)" if len(failed) > 1 else ""
    return [f"rank {failed[0]}{also}: {p}" for p in report[failed[0]]]
