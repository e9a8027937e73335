"""Sharded checkpoints (分布式检查点) of ZeRO/FSDP training with `torch.distributed.checkpoint` (DCP).

Why a plain `state_dict` no longer works: under ZeRO each rank holds only its shard — `torch.save` on one rank
saves 1/n of the model, and gathering everything onto one rank to save it needs the memory ZeRO removed.
DCP instead lets every rank write its own shard, with metadata saying which slice of which tensor it is, and
on load reads exactly the slices the new layout needs: a checkpoint saved at 4 ranks loads at 2 (resharding).

What is saved, per flat shard u (`zero1`/`zero2`: one per dtype of the model; `zero3`: per unit and dtype):
    "model.u"          the parameters, flattened (Ψ_u,), unpadded
    "optim.u.exp_avg", "optim.u.exp_avg_sq"   AdamW's moments, the same layout
    "optim.u.step"     AdamW's step per parameter (−1: never stepped), identical on every rank: saved once
Each rank's shard is handed to DCP as a DTensor sharded on dim 0 of a 1-D mesh: our layout (rank k owns
[k·⌈Ψ_u/n⌉, (k+1)·⌈Ψ_u/n⌉) ∩ [0, Ψ_u), padding at the end) is exactly DTensor's `torch.chunk` layout, so DCP
can cut the same global tensor differently for another world size.

Atomic: a save writes into a fresh temporary folder; only when every rank has finished, and rank 0 has
recorded the SHA-256 of every file, is it renamed to `root/step-K` and named in `root/LATEST`
(`checkpoint_files.py`: a save killed at any point, even one re-saving an existing step, leaves the previous
checkpoint as LATEST, whole). Loading checks those checksums before DCP reads a byte, and never unpickles
arbitrary objects: DCP's metadata file is read once, by an unpickler that admits only the exact classes DCP
writes, and handed to DCP (which would otherwise unpickle it again unchecked); tensors load with
`weights_only=True`. A damaged checkpoint, or one whose tensors do not match the model, raises a one-line
ValueError that names the file.

    save(strategy, "ckpt", step=10)      # every rank
    load(strategy, "ckpt")               # every rank, any world size → the step that was saved
    export_full(strategy, "model.pt")    # one file with the unsharded parameters (rank 0 writes it)
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard

from partrain_edu import checkpoint_files as files
from partrain_edu.parallel.flat_shard import FlatShard
from partrain_edu.parallel.zero import ZeroOptimizer

ADAM_STATES = ("exp_avg", "exp_avg_sq")


def _sharded(strategy) -> tuple[list[FlatShard], dict]:
    """The flat shards a strategy trains, and the optimizer state keyed by their pieces."""
    if isinstance(strategy.optimizer, ZeroOptimizer):                      # zero1 / zero2
        return strategy.optimizer.flats, strategy.optimizer.inner.state
    if hasattr(strategy.model, "flat_shards"):                             # zero3 / FullyShardedDataParallel
        return strategy.model.flat_shards(), strategy.optimizer.state
    raise ValueError(f"{type(strategy).__name__} has no flat shards: checkpoint a zero1, zero2 or zero3 strategy")


def _local(flat: FlatShard, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of the unpadded (Ψ_u,) tensor: the shard minus any padding (a view, no copy)."""
    real = max(0, min(flat.shard_numel, flat.numel - flat.rank * flat.shard_numel))
    return tensor[:real]


def _state_dict(strategy) -> dict[str, torch.Tensor]:
    """The DCP state dict: DTensors whose local parts are this rank's chunks (DCP loads into them in place).
    The optimizer keeps one state per parameter piece; they are laid out like the chunk they belong to."""
    flats, state = _sharded(strategy)
    # The shards' own group as a 1-D mesh: no new process group per save or load.
    group = flats[0].group if flats[0].group is not None else dist.group.WORLD
    mesh = DeviceMesh.from_group(group, flats[0].data.device.type)
    out = {}
    for i, flat in enumerate(flats):
        def dt(t, flat=flat):
            return DTensor.from_local(_local(flat, t), mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size([flat.numel]), stride=(1,))
        pieces = [state.get(piece, {}) for piece in flat.pieces]
        for st in pieces:
            if st and set(st) != {"step", *ADAM_STATES}:
                raise ValueError(f"checkpoints support Adam/AdamW states, got {sorted(st)}: use the default optimizer")
        out[f"model.{i}"] = dt(flat.data)
        for key in ADAM_STATES:                                            # (s,) the pieces' states
            out[f"optim.{i}.{key}"] = dt(flat.chunk_of([st.get(key) for st in pieces]))
        # A parameter's `step` lives with its pieces, on one rank or several; −1: never stepped (no state).
        steps = torch.tensor([float(st["step"]) if st else -1.0 for st in pieces], dtype=torch.float64)
        dist.all_reduce(steps, op=dist.ReduceOp.MAX, group=flat.group)
        out[f"optim.{i}.step"] = steps                                     # the same everywhere: saved once
    return out


def _restore_optimizer(strategy, loaded: dict[str, torch.Tensor]) -> None:
    """Hand the loaded chunks back to the pieces' optimizer states (and, for ZeRO-1/2, to every replica)."""
    flats, state = _sharded(strategy)
    for i, flat in enumerate(flats):
        steps = loaded[f"optim.{i}.step"]
        for j, (piece, (x, y)) in enumerate(zip(flat.pieces, flat.bounds, strict=True)):
            if steps[j] < 0:
                state.pop(piece, None)
                continue
            state[piece] = {"step": torch.tensor(float(steps[j])),
                            **{key: loaded[f"optim.{i}.{key}"].to_local()[x:y].clone() for key in ADAM_STATES}}
        if flat.full is not None:                            # zero1/2: every replica needs the full weights
            flat.all_gather(out=flat.full)


class _RecordingWriter(dcp.FileSystemWriter):
    """DCP's writer, noting which files this rank wrote (DCP names them: `__0_0.distcp`, ...)."""

    def __init__(self, folder: Path):
        super().__init__(str(folder))
        self.written: list[str] = []

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        self.written = sorted({result.storage_data.relative_path for result in future.wait()})
        return future


def _on_rank0(action):
    """Run `action` on rank 0 and hand its result, or its one-line error, to every rank: a failure there (an
    unwritable folder) must raise everywhere, not leave the other ranks waiting in the next collective."""
    box = [None, None]
    if dist.get_rank() == 0:
        try:
            box[0] = action()
        except ValueError as error:
            box[1] = str(error)
    dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise ValueError(box[1])
    return box[0]


def _one_line(error: CheckpointException) -> str:
    """DCP's CheckpointException prints every rank's traceback; the first rank's error is the useful line."""
    rank, (cause, _) = next(iter(error.failures.items()))
    text = str(cause).strip().splitlines()
    return f"rank {rank}: {type(cause).__name__}" + (f": {text[0]}" if text else "")


def save(strategy, root: str | os.PathLike, step: int) -> Path:
    """Every rank writes its shards into a fresh folder; once all are there, it becomes `root/step-K` and
    `root/LATEST` names it. Returns the folder."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a whole number >= 0, got {step!r}")
    root = Path(root)
    state = _state_dict(strategy)
    temp = Path(_on_rank0(lambda: str(files.prepare(root, step))))     # one name, chosen by rank 0
    writer = _RecordingWriter(temp)
    try:
        dcp.save(state, storage_writer=writer)
    except CheckpointException as error:                    # raised on every rank alike
        if dist.get_rank() == 0:
            shutil.rmtree(temp, ignore_errors=True)
        raise ValueError(f"saving step {step} into {root} failed ({_one_line(error)}); check that every rank can "
                         f"write there; LATEST still names the previous checkpoint") from None
    # Each rank hashes the files it wrote (in parallel, while they are in the page cache); rank 0 commits.
    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(files.checksums(temp, writer.written), gathered, dst=0)

    def commit() -> str:
        written = {name: entry for per_rank in gathered for name, entry in per_rank.items()}
        return str(files.commit(root, temp, step, written))
    return Path(_on_rank0(commit))


def latest(root: str | os.PathLike) -> Path:
    """The committed checkpoint folder that `root/LATEST` names (a `step-K` of `root`, nothing else)."""
    return files.resolve(root)[0]


# Exactly the globals DCP's metadata pickle names (torch 2.13), as (module, name) pairs. Nothing else is
# resolved: pickle would otherwise follow a dotted name ("filesystem", "os.system") to any function.
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
        "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
    ("torch", "Size"), ("collections", "OrderedDict"), ("builtins", "set"), ("pathlib", "PosixPath"),
} | {("torch", dtype) for dtype in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "uint8", "bool")}


class RefusedPickle(pickle.UnpicklingError):
    """The metadata names a global outside the allowlist: crafted or foreign, never loaded."""


class _MetadataOnly(pickle.Unpickler):
    """Admits only the exact (module, name) pairs above; anything else is refused, never imported or built."""

    def find_class(self, module, name):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        raise RefusedPickle(f"refusing to load {module}.{name} from checkpoint metadata: not a file DCP writes; "
                            "do not load this checkpoint")


def _metadata(folder: Path) -> Metadata:
    path = folder / ".metadata"
    with files.open_regular(path, folder) as f:   # lstat first: a FIFO would block open(), a link leads away
        try:
            metadata = _MetadataOnly(f).load()
        except RefusedPickle:
            raise
        except Exception as error:   # truncated, foreign or garbled bytes fail in many ways, all "damaged"
            detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(f"cannot read {path} ({detail}): it is damaged or not a checkpoint; "
                             f"{files.REPAIR_HINT}") from None
    if not (isinstance(metadata, Metadata) and isinstance(metadata.storage_data, dict)):
        raise ValueError(f"{path} holds a {type(metadata).__name__}, not DCP metadata: it is not a checkpoint; "
                         f"{files.REPAIR_HINT}")
    return metadata


def _verify(folder: Path, metadata: Metadata) -> None:
    """Every file DCP will read must be listed in checksums.json and match it (each rank checks a share)."""
    entries = files.manifest(folder)
    unlisted = sorted({info.relative_path for info in metadata.storage_data.values()} - set(entries))
    if unlisted:
        raise ValueError(f"checkpoint {folder}: {unlisted[0]} has no checksum in {files.MANIFEST}; "
                         f"{files.REPAIR_HINT}")
    problems = [None] * dist.get_world_size()
    dist.all_gather_object(problems, files.verify(folder, entries, dist.get_rank(), dist.get_world_size()))
    problem = next((p for p in problems if p), None)
    if problem:
        raise ValueError(problem)


class _SafeReader(dcp.FileSystemReader):
    """DCP's reader, except that its metadata comes from `_MetadataOnly`: DCP itself would `pickle.load` the
    file again, unchecked, after our check (and a file swapped in between would go unchecked)."""

    def __init__(self, folder: Path, metadata):
        super().__init__(str(folder))
        self._checked = metadata

    def read_metadata(self, *args, **kwargs):
        if getattr(self._checked, "storage_meta", None) is None:   # as FileSystemReader.read_metadata does
            self._checked.storage_meta = StorageMeta()
        self._checked.storage_meta.load_id = self.load_id
        return self._checked


def load(strategy, root: str | os.PathLike) -> int:
    """Load the latest checkpoint in `root` into `strategy` (any world size); returns the saved step."""
    folder, step = files.resolve(root)
    ours = _state_dict(strategy)
    metadata = _metadata(folder)
    _verify(folder, metadata)
    saved = metadata.state_dict_metadata
    for key, value in ours.items():
        size = tuple(value.shape)
        if key not in saved or tuple(getattr(saved[key], "size", ())) != size:
            found = tuple(saved[key].size) if key in saved else "missing"
            raise ValueError(f"checkpoint {folder} does not match this model: {key} is {found}, expected {size}; "
                             "load it into the same model configuration and strategy family")
    try:
        dcp.load(ours, storage_reader=_SafeReader(folder, metadata))   # writes into the chunks in place
    except CheckpointException as error:
        raise ValueError(f"loading {folder} failed ({_one_line(error)}); {files.REPAIR_HINT}") from None
    _restore_optimizer(strategy, ours)
    return step


def full_state_dict(strategy) -> dict[str, torch.Tensor]:
    """The unsharded parameters under TinyGPT's names (a collective: every rank calls it)."""
    if hasattr(strategy.model, "full_state_dict"):
        return strategy.model.full_state_dict()
    _sharded(strategy)
    return {k: v.detach().clone() for k, v in strategy.model.state_dict().items()}


def export_full(strategy, path: str | os.PathLike) -> None:
    """One file with the whole model, loadable by `torch.load(path, weights_only=True)` into a plain TinyGPT."""
    state = full_state_dict(strategy)
    if dist.get_rank() == 0:
        tmp = Path(str(path) + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
    dist.barrier()


def load_full(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Load an exported file into an unsharded model (no pickled objects: weights only)."""
    state = torch.load(path, weights_only=True)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"{path} does not match this model ({str(e).splitlines()[0]}); "
                         "build the model with the configuration it was saved from") from None
