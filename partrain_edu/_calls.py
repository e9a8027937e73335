"""Each rank's torch.distributed calls on record, and the collective mismatch they show, without any communication.

`record(folder, rank)`, run by the rank wrappers before the learner's code, wraps the functions CommTracer traces
(`comm._COSTS`) in torch.distributed and its distributed_c10d. Each call overwrites the one fixed-size record of
folder/rank{k}.calls: in (entered), out (returned) or raised; its number among this process's calls on that group
(send/recv: with that peer); the group's global ranks, the op, its tensors' dtypes and shapes (never their data),
the root or peer. A few µs per call, on any backend.

`diagnose` reads every rank's record. Ranks waiting in a group's collective that disagree on its op, root, shapes,
dtypes or number can never finish (Gloo may just wait for its timeout); a rank that ended, or is elsewhere, leaves
the others waiting. `Watch` polls the records during a run and reports a mismatch once it has stood still for
STABLE_S, so that the launcher can stop the run at once.
"""
from __future__ import annotations

import functools
import importlib.machinery
import inspect
import os
import re
import struct
import sys
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

POLL_S = 0.5  # how often a launcher reads the records
STABLE_S = 1.0  # a mismatch whose records stay the same this long is a hang: healthy ranks move on within µs
MISMATCH_HINT = ("Every rank must make the same collective calls in the same order: look for an `if rank ...` "
                 "around a collective, an early `return` or `sys.exit()`, or a loop whose length differs by rank.")
_SAME_CALL = ("every rank must call the same collectives in the same order with the same shapes and dtypes; look "
              "for a size that depends on the rank (an uneven split), a dtype that differs, or a collective that "
              "only some ranks call.")
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
        import torch.distributed.distributed_c10d as c10d

        from partrain_edu.comm import _COSTS
        if not dist.is_available():
            return
        wrappers: dict = {}  # dist.isend is c10d.isend: one wrapper for both (P2POp checks `op in [isend, irecv]`)
        for module in (dist, c10d):
            for name in _COSTS:
                if (original := vars(module).get(name)) is not None:
                    if original not in wrappers:
                        wrappers[original] = _wrap(name, original)
                    setattr(module, name, wrappers[original])
    except Exception as error:  # noqa: BLE001 - bookkeeping must never cost the learner their `import torch`
        print(f"partrain_edu: collective calls are not recorded ({error!r})", file=sys.stderr)


def _wrap(name: str, original):
    from torch import Tensor
    from torch.distributed import distributed_c10d as c10d

    parameters = inspect.signature(original).parameters
    names, op, ends = tuple(parameters), name.encode(), _OTHER_END.get(name)
    defaults = {n: p.default for n, p in parameters.items() if p.default is not p.empty}
    position = {n: i for i, n in enumerate(names)}

    def value(args: tuple, kwargs: dict, key: str):
        i = position[key]
        return args[i] if i < len(args) else kwargs.get(key, defaults.get(key))

    def entry(args: tuple, kwargs: dict) -> tuple[list, bytes] | None:
        """This call's group counter and record, or None where torch does nothing (no group yet, not a member)."""
        group = value(args, kwargs, "group")
        pg = c10d.GroupMember.WORLD if group is None else group
        members = None if pg is None or c10d._rank_not_in_group(group) else c10d._world.pg_group_ranks.get(pg)
        if members is None:
            return None
        ranks, end = tuple(members), -1
        if ends:
            end = value(args, kwargs, ends[0])
            if end is None:
                end = -1 if (local := value(args, kwargs, ends[1])) is None else ranks[local]
        gname = c10d._world.pg_names.get(pg, "?")
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


@dataclass(frozen=True)
class Finding:  # what the records say
    kind: str  # "mismatch": ranks in one collective disagree; "behind": ranks wait for one that is not there
    text: str
    rank: int  # the rank to look at first
    evidence: tuple[bytes, ...]  # the records it rests on: the same ones later mean that nobody moved


def explain_calls(folder: str | os.PathLike, nproc: int, finished: set[int] | None = None) -> str | None:
    """One or two sentences on the collective the ranks are stuck in, from their records; None if they say nothing.
    `finished`: the ranks that ended cleanly (default: those with a rank{k}.done in `folder`)."""
    found = diagnose(folder, nproc, finished)
    return found.text if found else None


def diagnose(folder: str | os.PathLike, nproc: int, finished: set[int] | None = None,
             live: bool = False) -> Finding | None:
    """As `explain_calls`, with the rank to blame. `live`: the ranks still run, so a rank waits only while it is in
    a call, ranks at different numbers tell only once every unfinished member waits, and a call that raised is left
    to the rank's own error; after a failure, it is where that rank waited."""
    if finished is None:
        finished = {k for k in range(nproc) if Path(folder, f"rank{k}.done").exists()}
    everyone = {r: c for r, c in read(folder, nproc).items() if not live or c.state != "raised"}
    calls = {r: c for r, c in everyone.items() if c.op not in P2P}
    stuck: dict[tuple, dict[int, Call]] = {}
    for r, c in sorted(calls.items()):
        if c.state != "out" and r not in finished and c.ranks:
            stuck.setdefault((c.group, c.ranks), {})[r] = c
    found = []
    for (group, ranks), waiters in stuck.items():
        mine = {r: c for r, c in calls.items() if (c.group, c.ranks) == (group, ranks)}
        # In correct code a group's call #n is the same collective on every rank: two that differ are a mismatch,
        # whatever the ranks do now. Different numbers tell only once every member waits: none can move on.
        for n in sorted({c.number for c in waiters.values()}):
            found.append(_mismatch({r: c for r, c in mine.items() if c.number == n}, ranks))
        if not live or set(waiters) == set(ranks) - finished:
            found.append(_mismatch(waiters, ranks) or _behind(waiters, mine, everyone, ranks, finished))
    return min(filter(None, found), key=lambda f: f.kind != "mismatch", default=None)


def _mismatch(compared: dict[int, Call], ranks: tuple[int, ...]) -> Finding | None:
    clusters: dict[tuple, list[Call]] = {}
    for _, c in sorted(compared.items()):
        clusters.setdefault(c.key(), []).append(c)
    if len(clusters) < 2:
        return None
    ordered = sorted(clusters.values(), key=lambda cs: (len(cs), cs[0].rank))  # the odd one out first
    parts = []
    for i, cs in enumerate(ordered):
        one, inside = len(cs) == 1, any(c.state != "out" for c in cs)  # "out": the backend let it through
        number = f" ({'its' if one else 'their'} call #{cs[0].number}"
        if i == 0:
            verb = ("is in" if one else "are in") if inside else "completed"
            parts.append(f"{_who(cs)} {verb} {cs[0].text()}{number} on ranks {_span(ranks)})")
        else:
            shown = number + ")" if cs[0].number != ordered[0][0].number else ""
            parts.append(f"{_who(cs)} {'in' if inside else 'completed'} {cs[0].text()}{shown}")
    return Finding("mismatch", f"collective mismatch: {', '.join(parts)}: {_SAME_CALL}", ordered[0][0].rank,
                   tuple(c.raw for c in compared.values()))


def _behind(waiters: dict[int, Call], mine: dict[int, Call], everyone: dict[int, Call], ranks: tuple[int, ...],
            finished: set[int]) -> Finding | None:
    """Members that never made the call the others wait in: they ended, are in another call, or elsewhere."""
    first = next(iter(waiters.values()))
    phrases: dict[str, list[int]] = {}
    for r in sorted(ranks):
        own, last = mine.get(r), everyone.get(r)
        if r in waiters or (own is not None and own.number >= first.number):
            continue  # it made that call
        count = own.number if own else 0 if last is None else None  # None: its last call was on another group
        counted = "" if count is None else f" after {count} collective{'' if count == 1 else 's'}"
        if r in finished:
            phrase = f"ended{counted}"
        elif own is None and last is not None and last.state != "out":
            phrase = f"{{be}} in {last.text()} on ranks {_span(last.ranks)}"
        else:
            phrase = f"{{be}} elsewhere{counted}"
        phrases.setdefault(phrase, []).append(r)
    if not phrases:
        return None
    who = "; ".join(f"{_who(rs)} {p.format(be='is' if len(rs) == 1 else 'are')}" for p, rs in phrases.items())
    one, n = len(waiters) == 1, first.number
    nth = f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"
    text = (f"{who} while {_who(waiters)} wait{'s' if one else ''} in {'its' if one else 'their'} {nth} "
            f"({first.text()} on ranks {_span(ranks)}). {MISMATCH_HINT}")
    return Finding("behind", text, min(r for rs in phrases.values() for r in rs),
                   tuple(c.raw for c in waiters.values()))


def _who(ranks) -> str:
    ranks = sorted(getattr(r, "rank", r) for r in ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_span(ranks)}"


def _span(ranks) -> str:
    """"0–3, 5" for ranks 0, 1, 2, 3, 5."""
    runs = [[r for _, r in run] for _, run in groupby(enumerate(sorted(ranks)), lambda p: p[1] - p[0])]
    return ", ".join(f"{run[0]}–{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


class Watch:
    """Polled by a launcher while its ranks run: `poll` returns a mismatch once the same one, every record involved
    unchanged, has been seen for STABLE_S; it reads the records at most every POLL_S."""

    def __init__(self, folder: str | os.PathLike, nproc: int):
        self.folder, self.nproc, self.next_look, self.seen = folder, nproc, 0.0, None

    def poll(self, finished: set[int] | None = None) -> Finding | None:
        now = time.monotonic()
        if now < self.next_look:
            return None
        self.next_look = now + POLL_S
        found = diagnose(self.folder, self.nproc, finished, live=True)
        if found is None or found.kind != "mismatch":
            self.seen = None
        elif self.seen is None or self.seen[0] != found.evidence:
            self.seen = (found.evidence, now)
        elif now - self.seen[1] >= STABLE_S:
            return found
        return None
