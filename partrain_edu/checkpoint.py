"""Sharded checkpoints (分布式检查点) of ZeRO/FSDP training with `torch.distributed.checkpoint` (DCP).

Why a plain `state_dict` no longer works: under ZeRO each rank holds only its shard — `torch.save` on one rank
saves 1/n of the model, and gathering everything onto one rank to save it needs the memory ZeRO removed.
DCP instead lets every rank write its own shard, with metadata saying which slice of which tensor it is, and
on load reads exactly the slices the new layout needs: a checkpoint saved at 4 ranks loads at 2 (resharding).

What is saved, per unit u of a `zero1`/`zero2` (one unit: the whole model) or `zero3` strategy:
    "model.u"          the unit's parameters, flattened (Ψ_u,), unpadded
    "optim.u.exp_avg", "optim.u.exp_avg_sq"   AdamW's moments, the same layout
    "optim.u.step"     AdamW's step counter (identical on every rank: saved once)
Each rank's shard is handed to DCP as a DTensor sharded on dim 0 of a 1-D mesh: our layout (rank k owns
[k·⌈Ψ_u/n⌉, (k+1)·⌈Ψ_u/n⌉) ∩ [0, Ψ_u), padding at the end) is exactly DTensor's `torch.chunk` layout, so DCP
can cut the same global tensor differently for another world size.

Atomic: a save writes into a new folder `root/step-K`; only when every rank has finished does rank 0 point
`root/LATEST` at it (write a temporary file, then `os.replace`, atomic on POSIX). A save killed halfway leaves
`LATEST` on the previous checkpoint. Loading never unpickles arbitrary objects: DCP's metadata file is read
once, by an unpickler that admits only the exact classes DCP writes, and handed to DCP (which would otherwise
unpickle it again unchecked); tensors load with `weights_only=True`. A checkpoint whose tensors do not match the model raises a one-line ValueError.

    save(strategy, "ckpt", step=10)      # every rank
    load(strategy, "ckpt")               # every rank, any world size → the step that was saved
    export_full(strategy, "model.pt")    # one file with the unsharded parameters (rank 0 writes it)
"""
from __future__ import annotations

import os
import pickle
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from partrain_edu.parallel.zero import FlatShard

ADAM_STATES = ("exp_avg", "exp_avg_sq")


def _units(strategy) -> list[FlatShard]:
    if hasattr(strategy.model, "units"):                     # zero3
        return [u.flat for u in strategy.model.units]
    if hasattr(strategy, "flat"):                            # zero1 / zero2
        return [strategy.flat]
    raise ValueError(f"{type(strategy).__name__} has no flat shards: checkpoint a zero1, zero2 or zero3 strategy")


def _local(flat: FlatShard, tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of the unpadded (Ψ_u,) tensor: the shard minus any padding (a view, no copy)."""
    real = max(0, min(flat.shard_numel, flat.numel - flat.rank * flat.shard_numel))
    return tensor[:real]


def _state_dict(strategy) -> dict[str, torch.Tensor]:
    """The DCP state dict: DTensors whose local parts are views of this rank's shards (DCP loads in place)."""
    units = _units(strategy)
    mesh = init_device_mesh(units[0].shard.device.type, (units[0].world,))
    opt = strategy.optimizer
    out = {}
    for i, flat in enumerate(units):
        def dt(t):
            return DTensor.from_local(_local(flat, t), mesh, [Shard(0)], run_check=False,
                                      shape=torch.Size([flat.numel]), stride=(1,))
        state = opt.state[flat.shard]
        if not state:                                        # before the first step: create AdamW's state
            state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(flat.shard),
                         exp_avg_sq=torch.zeros_like(flat.shard))
        if set(state) != {"step", *ADAM_STATES}:
            raise ValueError(f"checkpoints support Adam/AdamW states, got {sorted(state)}: use the default optimizer")
        out[f"model.{i}"] = dt(flat.shard.data)
        for key in ADAM_STATES:
            out[f"optim.{i}.{key}"] = dt(state[key])
        out[f"optim.{i}.step"] = state["step"]
    return out


def save(strategy, root: str | os.PathLike, step: int) -> Path:
    """Every rank writes its shards into `root/step-K`; then `root/LATEST` names it. Returns the folder."""
    root = Path(root)
    folder = root / f"step-{step}"
    dcp.save(_state_dict(strategy), checkpoint_id=str(folder))
    dist.barrier()                                           # every rank's shard is on disk
    if dist.get_rank() == 0:
        tmp = root / "LATEST.tmp"
        tmp.write_text(folder.name)
        os.replace(tmp, root / "LATEST")                     # the commit: atomic
    dist.barrier()
    return folder


def latest(root: str | os.PathLike) -> Path:
    root = Path(root)
    if not (root / "LATEST").is_file():
        raise ValueError(f"no checkpoint in {root} (no LATEST file): save one first, or pass the right folder")
    return root / (root / "LATEST").read_text().strip()


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


class _MetadataOnly(pickle.Unpickler):
    """Admits only the exact (module, name) pairs above; anything else is refused, never imported or built."""

    def find_class(self, module, name):
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from checkpoint metadata")


def _metadata(folder: Path):
    with open(folder / ".metadata", "rb") as f:
        return _MetadataOnly(f).load()


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
    folder = latest(root)
    ours = _state_dict(strategy)
    metadata = _metadata(folder)
    saved = metadata.state_dict_metadata
    for key, value in ours.items():
        size = tuple(value.shape)
        if key not in saved or tuple(getattr(saved[key], "size", ())) != size:
            found = tuple(saved[key].size) if key in saved else "missing"
            raise ValueError(f"checkpoint {folder} does not match this model: {key} is {found}, expected {size}; "
                             "load it into the same model configuration and strategy family")
    dcp.load(ours, storage_reader=_SafeReader(folder, metadata))   # writes into the shard views in place
    for i, flat in enumerate(_units(strategy)):
        strategy.optimizer.state[flat.shard]["step"] = ours[f"optim.{i}.step"]
        if flat.full is not None:                            # zero1/2: every replica needs the full weights
            flat.all_gather(out=flat.full)
    return int(folder.name.split("-")[1])


def full_state_dict(strategy) -> dict[str, torch.Tensor]:
    """The unsharded parameters under TinyGPT's names (a collective: every rank calls it)."""
    if hasattr(strategy.model, "full_state_dict"):
        return strategy.model.full_state_dict()
    _units(strategy)
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
