"""Each rank's torch.distributed calls on record, without any communication (what they show: diagnose/findings.py).

`record(folder, rank)`, run by the rank wrappers before the learner's code, wraps the functions CommTracer traces
(`comm.costs.COSTS`) in torch.distributed and its distributed_c10d. Each call overwrites the one fixed-size record of
folder/rank{k}.calls: in (entered), out (returned) or raised; its number among this process's calls on that group
(send/recv: with that peer); the group's global ranks, the op, its tensors' dtypes and shapes (never their data),
the root or peer. A few µs per call, on any backend.

`read` returns every rank's record as a `Call`, whose `key()` is what all ranks' call of that number must agree on.
"""
from __future__ import annotations

import functools
import importlib.machinery
import inspect
import os
import re
import struct
import sys
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

_RECORD = struct.Struct("<4sc3xIi16s96s24s104s")  # magic, state, number, root/peer, group, its ranks, op, tensors
_MAGIC, _STATES = b"PTC1", {b"i": "in", b"o": "out", b"r": "raised"}
P2P = frozenset({"send", "recv", "isend", "irecv"})
_OTHER_END = {"broadcast": ("src", "group_src"), "scatter": ("src", "group_src"), "reduce": ("dst", "group_dst"),
              "gather": ("dst", "group_dst"), "send": ("dst", "group_dst"), "isend": ("dst", "group_dst"),
              "recv": ("src", "group_src"), "irecv": ("src", "group_src")}
# Ops whose tensors may rightly differ by rank (a root's list, uneven splits): compare only the argument that may
# not (its place among the tensor arguments), or only the dtypes.
_COMPARED = {"gather": 0, "scatter": 0, "all_gather": 0, "reduce_scatter": 1}
_DTYPES_ONLY = {"all_to_all", "all_to_all_single"}
_recorder: dict = {"fd": None, "groups": {}}  # the record's file; (group name, ranks[, peer]) -> [count, name, ranks]


def record(folder: str | os.PathLike, rank: int) -> None:
    """Record this process's calls in folder/rank{rank}.calls from now on: at once if torch is loaded, else as soon
    as it is (a script that never imports torch does not pay for it)."""
    try:
        _recorder["fd"] = os.open(Path(folder, f"rank{rank}.calls"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    except OSError:  # the folder is gone: so is the launcher, and this rank is about to be stopped
        return
    if "torch" in sys.modules:
        _install()
    else:
        sys.meta_path.insert(0, _AfterTorch())


def between_cells() -> None:
    """A warm rank starts a cell: a call that raised in an earlier one is no longer where this rank is."""
    if _recorder["fd"] is not None:
        os.pwrite(_recorder["fd"], b"o", 4)


class _AfterTorch:
    """An import hook: torch loads as usual, then the wrappers are installed before `import torch` returns."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            load = spec.loader.exec_module
            spec.loader.exec_module = lambda module: (load(module), _install())
        return spec


def _install() -> None:
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        from partrain_edu.comm.costs import COSTS
        from partrain_edu.comm.patch import patch_collectives

        patch_collectives(COSTS, _wrap)   # for the process's life: nothing to restore
    except Exception as error:  # noqa: BLE001 - bookkeeping must never cost the learner their `import torch`
        print(f"partrain_edu: collective calls are not recorded ({error!r})", file=sys.stderr)


def _wrap(name: str, original):
    import torch.distributed as dist
    from torch import Tensor

    parameters = inspect.signature(original).parameters
    names = tuple(parameters)
    op = name.encode()
    ends = _OTHER_END.get(name)
    defaults = {n: p.default for n, p in parameters.items() if p.default is not p.empty}
    position = {n: i for i, n in enumerate(names)}

    def value(args: tuple, kwargs: dict, key: str):
        i = position[key]
        return args[i] if i < len(args) else kwargs.get(key, defaults.get(key))

    def entry(args: tuple, kwargs: dict) -> tuple[list, bytes] | None:
        """This call's group counter and record, or None where torch does nothing (no group yet, not a member)."""
        group = value(args, kwargs, "group")
        pg = dist.group.WORLD if group is None else group
        if pg is None or dist.get_rank(pg) < 0:  # torch's public words for "no group yet" and "not a member"
            return None
        ranks, end = tuple(dist.get_process_group_ranks(pg)), -1
        if ends:
            end = value(args, kwargs, ends[0])
            if end is None:
                end = -1 if (local := value(args, kwargs, ends[1])) is None else ranks[local]
        gname = pg.group_name
        key = (gname, ranks, end) if name in P2P else (gname, ranks)
        if (counter := _recorder["groups"].get(key)) is None:
            listed = ",".join(map(str, ranks)).encode()  # too long for the record: "?", never diagnosed
            counter = _recorder["groups"][key] = [0, gname.encode()[:16], listed if len(listed) <= 96 else b"?"]
        # In signature order: the same text however the arguments were passed.
        tensors = _tensors((args[i] if i < len(args) else kwargs.get(n) for i, n in enumerate(names)), Tensor).encode()
        tensors = tensors if len(tensors) <= 104 else tensors[:101] + b"..."
        counter[0] += 1
        return counter, _RECORD.pack(_MAGIC, b"i", counter[0], end, counter[1], counter[2], op, tensors)

    @functools.wraps(original)  # CommTracer and the emulator wrap this in turn: inspect.signature must still work
    def recorded(*args, **kwargs):
        try:
            counter, head = entry(args, kwargs) or (None, None)
        except Exception:  # noqa: BLE001 - arguments torch will reject: let torch say so
            counter = None
        if counter is None:
            return original(*args, **kwargs)
        fd = _recorder["fd"]
        try:
            os.pwrite(fd, head, 0)
            result = original(*args, **kwargs)
        except BaseException:
            counter[0] -= 1  # torch refused the call, or it failed: the next one takes its number, as on the others
            os.pwrite(fd, b"r", 4)
            raise
        os.pwrite(fd, b"o", 4)
        return result

    return recorded


def _tensors(values, Tensor) -> str:
    """"float32[4]" for a tensor, "[float32[4]]*2+[int64[]]" for a list (Python's syntax); nothing for the rest."""
    def one(dtype, shape) -> str:
        return f"{str(dtype).removeprefix('torch.')}[{','.join(map(str, shape))}]"

    parts = []
    for v in values:
        if isinstance(v, Tensor):
            parts.append(one(v.dtype, v.shape))
        elif type(v) in (list, tuple) and v and isinstance(v[0], Tensor):
            runs = [(key, len(list(run))) for key, run in groupby(v[:64], lambda t: (t.dtype, t.shape))]
            parts.append("+".join(f"[{one(*key)}]" + (f"*{n}" if n > 1 else "") for key, n in runs))
    return ", ".join(parts)


@dataclass(frozen=True)
class Call:
    """One rank's record: the call it is in, or made last."""

    rank: int
    state: str  # "in", "out" (returned) or "raised"
    number: int  # among this rank's calls on the group (send/recv: with that peer)
    end: int  # root or peer (global rank), -1 if none
    group: str
    ranks: tuple[int, ...]  # the group's global ranks
    op: str
    tensors: str
    raw: bytes

    def text(self) -> str:
        root = f" {'from' if _OTHER_END[self.op][0] == 'src' else 'to'} rank {self.end}" if self.end >= 0 else ""
        return f"{self.op}{' ' if self.tensors else ''}{self.tensors}{root}"

    def key(self) -> tuple:
        """What every rank's call with this number must agree on."""
        tensors = self.tensors
        if self.op in _COMPARED:
            tensors = (tensors.split(", ") + [""])[_COMPARED[self.op]]
        elif self.op in _DTYPES_ONLY:
            tensors = " ".join(sorted(set(re.findall(r"(\w+)\[", tensors))))
        return self.number, self.op, self.end, tensors


def read(folder: str | os.PathLike, nproc: int) -> dict[int, Call]:
    calls = {}  # every rank's record that can be read whole
    for rank in range(nproc):
        try:
            raw = Path(folder, f"rank{rank}.calls").read_bytes()
        except OSError:
            continue
        if len(raw) != _RECORD.size or raw[:4] != _MAGIC or raw[4:5] not in _STATES:
            continue
        _, state, number, end, *fields = _RECORD.unpack(raw)
        group, ranks, op, tensors = (b.rstrip(b"\0").decode(errors="replace") for b in fields)
        members = tuple(map(int, ranks.split(","))) if ranks not in ("", "?") else ()
        calls[rank] = Call(rank, _STATES[state], number, end, group, members, op, tensors, raw)
    return calls
