"""The files of a checkpoint folder: atomic commits, checksums and the `LATEST` pointer (checkpoint.py's disk side).

    root/LATEST                "step-K": the committed checkpoint that `load` reads
    root/step-K/               one committed save: DCP's shard files, its `.metadata`, and `checksums.json`
    root/.step-K.tmp-<hex>/    a save in progress, or one that was killed: never named by LATEST
    root/.step-K.previous/     the old step-K while a re-save of step K replaces it

Why a fresh folder per save: DCP writes its files in place, so re-saving into an existing `step-K` and dying
halfway left LATEST naming a folder with some shards from each save — a checkpoint of no step, loaded without
complaint. Now a save writes into a temporary folder, and only when every rank has written its files and
rank 0 has recorded their checksums is it renamed to `step-K`. A folder cannot be renamed over a non-empty
one, so an existing `step-K` is moved aside first; if the save dies between the two renames, `resolve`
reads the copy that was moved aside, and the next save puts it back (`tidy`).

Why checksums: DCP reads whatever bytes are there — a flipped byte loads as a silently different parameter,
a truncated shard fails deep inside DCP. `checksums.json` holds the size and SHA-256 of every file the save
wrote; `verify` checks them before DCP reads anything and names the damaged file.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

MANIFEST = "checksums.json"
_STEP = re.compile(r"step-([0-9]+)")
_TEMP = re.compile(r"\.step-[0-9]+\.tmp-[0-9a-f]+")
_ASIDE = re.compile(r"\.step-([0-9]+)\.previous")
REPAIR_HINT = "restore the folder from a copy, or write the name of an earlier step-K folder into LATEST"


def kind_of(path: Path) -> str | None:
    """What `lstat` says `path` is when it is not a plain regular file ("a symbolic link", "a FIFO", ...), or
    None for a regular file: checked before a checkpoint file is opened (a FIFO would block `open`)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                                         (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))
                 if test(mode)), "a device")


def open_regular(path: Path, folder: Path):
    """`path` opened for reading in binary, if it is a regular file and no link; else a one-line ValueError.
    O_NOFOLLOW | O_NONBLOCK, then fstat: a file swapped in after the check can neither redirect nor block."""
    kind = kind_of(path)
    if kind is None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            kind = kind_of(path) or "unreadable"
        else:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return os.fdopen(fd, "rb")
            os.close(fd)
            kind = "not a regular file"
    raise ValueError(f"checkpoint {folder} is damaged: {path.name} is {kind}, not a saved file; {REPAIR_HINT}")


def _aside(root: Path, name: str) -> Path:
    return root / f".{name}.previous"


def resolve(root: str | os.PathLike) -> tuple[Path, int]:
    """The folder LATEST names, and its step. Only a `step-K` inside `root`: never a path elsewhere."""
    root = Path(root)
    if kind_of(root / "LATEST") == "missing":
        raise ValueError(f"no checkpoint in {root} (no LATEST file): save one first, or pass the right folder")
    with open_regular(root / "LATEST", root) as f:
        raw = f.read(200)                              # a name, not a file's worth of bytes
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ValueError(f"{root}/LATEST is not text: write the name of a step-K folder of {root} into it, "
                         "e.g. step-10") from None
    if not _STEP.fullmatch(name):
        raise ValueError(f"{root}/LATEST names {name!r}, not a step-K folder of {root}: write the name of one "
                         "into it, e.g. step-10")
    for folder in (root / name, _aside(root, name)):   # the aside copy: a re-save died between its renames
        if folder.is_symlink():   # a link would load files from anywhere on the machine
            raise ValueError(f"{folder} is a symbolic link, not a checkpoint saved here: replace it with the "
                             "folder itself (copy it in), or point LATEST at a real step-K folder")
        if folder.is_dir():
            return folder, int(_STEP.fullmatch(name)[1])
    raise ValueError(f"{root}/LATEST names {name}, but there is no folder {root / name}: write the name of an "
                     "existing step-K folder into LATEST, or save again")


def prepare(root: Path, step: int) -> Path:
    """Rank 0, before a save: clear what killed saves left, and create the save's own temporary folder."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tidy(root)
        temp = root / f".step-{step}.tmp-{uuid.uuid4().hex}"
        temp.mkdir()
    except OSError as error:
        raise ValueError(f"cannot write a checkpoint into {root} ({error.strerror or error}): "
                         "pass a folder you can write to") from None
    return temp


def tidy(root: Path) -> None:
    """Delete temporary folders of killed saves; of a moved-aside step-K, keep it only if step-K is gone."""
    for entry in root.iterdir():
        if not entry.is_dir():
            continue
        aside = _ASIDE.fullmatch(entry.name)
        if _TEMP.fullmatch(entry.name):
            shutil.rmtree(entry)
        elif aside and (root / f"step-{aside[1]}").exists():
            shutil.rmtree(entry)                           # its replacement was committed
        elif aside:
            os.replace(entry, root / f"step-{aside[1]}")  # its replacement died: put it back


def checksums(folder: Path, names: list[str]) -> dict[str, dict]:
    """Size and SHA-256 of the named files of `folder` (each rank hashes the files it wrote)."""
    out = {}
    for name in names:
        with open_regular(folder / name, folder) as f:
            out[name] = {"bytes": os.fstat(f.fileno()).st_size,
                         "sha256": hashlib.file_digest(f, "sha256").hexdigest()}
    return out


def commit(root: Path, temp: Path, step: int, written: dict[str, dict]) -> Path:
    """Rank 0, once every rank's files are in `temp`: record the checksums, rename `temp` to `step-K`, point
    LATEST at it. Every step is a rename or a new file, so a kill at any point leaves a loadable LATEST."""
    folder, aside = root / f"step-{step}", _aside(root, f"step-{step}")
    try:
        _write_durably(temp / MANIFEST, json.dumps({**written, **checksums(temp, [".metadata"])}, indent=1))
        if folder.exists():
            os.replace(folder, aside)                 # `prepare` removed any older aside copy
        os.replace(temp, folder)
        _write_durably(root / "LATEST.tmp", folder.name)
        os.replace(root / "LATEST.tmp", root / "LATEST")
        _sync_folder(root)
        shutil.rmtree(aside, ignore_errors=True)
    except OSError as error:
        raise ValueError(f"cannot commit the checkpoint {folder} ({error.strerror or error}): "
                         "check the free space and permissions of the folder") from None
    return folder


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _sync_folder(folder: Path) -> None:
    """Make the renames inside `folder` survive a power cut, not only a killed process."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def manifest(folder: Path) -> dict[str, dict]:
    """`checksums.json` of a committed folder: file name → {"bytes", "sha256"}."""
    if kind_of(folder / MANIFEST) == "missing":
        raise ValueError(f"checkpoint {folder} has no {MANIFEST}: it was not committed by this version's "
                         f"checkpoint.save; {REPAIR_HINT}")
    with open_regular(folder / MANIFEST, folder) as f:   # a link or a FIFO: refused before it is read
        try:
            entries = json.loads(f.read(64 * 2**20))
        except (OSError, ValueError):   # unreadable, not UTF-8, not JSON
            entries = None
    if not (isinstance(entries, dict) and all(isinstance(e, dict) and {"bytes", "sha256"} <= set(e)
                                              for e in entries.values())):
        raise ValueError(f"checkpoint {folder}: {MANIFEST} is damaged; {REPAIR_HINT}")
    for name in entries:   # plain file names of this folder: a manifest must not send us reading elsewhere
        if name in (".", "..") or "/" in name or "\\" in name:
            raise ValueError(f"checkpoint {folder}: {MANIFEST} names {name!r}, not a file of the folder; {REPAIR_HINT}")
    return entries


def verify(folder: Path, entries: dict[str, dict], rank: int = 0, world: int = 1) -> str | None:
    """Check this rank's share of the files (every world-th one); the first problem as one line, or None."""
    for name in sorted(entries)[rank::world]:
        path, want = folder / name, entries[name]
        kind = kind_of(path)
        if kind is not None:
            return f"checkpoint {folder} is damaged: {name} is {kind}, not a saved file; {REPAIR_HINT}"
        size = path.lstat().st_size
        if size != want["bytes"]:
            return (f"checkpoint {folder} is damaged: {name} has {size} bytes, {want['bytes']} were saved "
                    f"(truncated or overwritten); {REPAIR_HINT}")
        try:
            digest = checksums(folder, [name])[name]["sha256"]
        except ValueError as problem:   # swapped for a link or a FIFO since the lstat
            return str(problem)
        if digest != want["sha256"]:
            return f"checkpoint {folder} is damaged: {name} does not match its SHA-256 in {MANIFEST}; {REPAIR_HINT}"
    return None
