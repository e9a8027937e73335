"""What the ranks' call records (call_records.py) say when a run is stuck: a collective mismatch, or ranks left waiting.

Ranks waiting in a group's collective that disagree on its op, root, shapes, dtypes or number can never finish
(Gloo may just wait for its timeout); a rank that ended, or is elsewhere, leaves the others waiting. `diagnose`
names it and the rank to look at first; `Watch` polls the records while a run goes on and reports a mismatch once
it has stood still for STABLE_S, so that the launcher can stop the run at once. No communication: files only.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path

from partrain_edu.launcher.call_records import P2P, Call, read

POLL_S = 0.5  # how often a launcher reads the records
STABLE_S = 1.0  # a mismatch whose records stay the same this long is a hang: healthy ranks move on within µs
MISMATCH_HINT = ("Every rank must make the same collective calls in the same order: look for an `if rank ...` "
                 "around a collective, an early `return` or `sys.exit()`, or a loop whose length differs by rank.")
# Gloo may let a mismatched call "complete" on some ranks, with wrong values: what they printed after it is noise.
AFTER_MISMATCH = ("Anything a rank printed after that call (above) is no result: the call did not match, and a rank "
                  "that got past it computed with the wrong partners' data.")
_SAME_CALL = ("every rank must call the same collectives in the same order with the same shapes and dtypes; look "
              "for a size that depends on the rank (an uneven split), a dtype that differs, or a collective that "
              "only some ranks call.")


@dataclass(frozen=True)
class Finding:  # what the records say
    kind: str  # "mismatch": ranks in one collective disagree; "behind": ranks wait for one that is not there
    text: str
    rank: int  # the rank to look at first
    evidence: tuple[bytes, ...]  # the records it rests on: the same ones later mean that nobody moved


def diagnose(folder: str | os.PathLike, nproc: int, finished: set[int] | None = None,
             live: bool = False) -> Finding | None:
    """What the records say the ranks are stuck in, and the rank to blame; None if they say nothing. `finished`:
    the ranks that ended cleanly (default: those with a rank{k}.done). `live`: the ranks still run, so a rank
    waits only while it is in a call, ranks at different numbers tell only once every unfinished member waits, and
    a call that raised is left to the rank's own error; after a failure, it is where that rank waited."""
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
    unchanged, has been seen for STABLE_S; it reads the records at most every POLL_S. `ended=True` (the warm pool,
    whose ranks end a cell without exiting): also ranks waiting for members that all ended cleanly — in live mode
    a "behind" finding means every member waits or ended, so none can arrive."""

    def __init__(self, folder: str | os.PathLike, nproc: int, ended: bool = False):
        self.folder = folder
        self.nproc = nproc
        self.next_look = 0.0
        self.seen = None
        self.kinds = ("mismatch", "behind") if ended else ("mismatch",)

    def poll(self, finished: set[int] | None = None) -> Finding | None:
        now = time.monotonic()
        if now < self.next_look:
            return None
        self.next_look = now + POLL_S
        found = diagnose(self.folder, self.nproc, finished, live=True)
        if found is None or found.kind not in self.kinds:
            self.seen = None
        elif self.seen is None or self.seen[0] != found.evidence:
            self.seen = (found.evidence, now)
        elif now - self.seen[1] >= STABLE_S:
            return found
        return None
