"""Process-group set-up and the small helpers every distributed cell uses.

What it does: `init()` turns the environment that torchrun gives each rank (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT) into a process group and returns a frozen `ParallelContext` — the one object a
strategy needs to know who it is. NCCL when every local rank has its own GPU, Gloo (CPU) otherwise. With no
torchrun environment it builds a world of size 1 in memory, so the same cell also runs standalone.

Why a context object and not globals: a notebook re-runs cells. A module-level "current group" would survive
the re-run and silently talk to a dead group; passing the context explicitly makes every dependency visible
(torchtitan's `ParallelDims` works the same way).

Run a cell on 4 ranks from a notebook:

    %%torchrun -n 4
    from partrain_edu import runtime
    ctx = runtime.init()
    runtime.print0(f"world size {ctx.world_size} on {ctx.backend}")
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import pickle
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from partrain_edu import topology
from partrain_edu.topology import Topology

DEFAULT_TIMEOUT_S = 60.0
# Set by the launcher: the folder where `publish` drops values for the notebook.
PUBLISH_DIR_ENV = "PARTRAIN_PUBLISH_DIR"
TIMEOUT_ENV = "PARTRAIN_TIMEOUT"
BACKEND_ENV = "PARTRAIN_BACKEND"
DEVICE_ENV = "PARTRAIN_DEVICE"      # `%%torchrun --device emulated:a100`: the device `init()` times with

TIMEOUT_HINT = (
    "A collective waited longer than the timeout. The ranks probably did not make the same collective calls "
    "in the same order, with the same shapes and the same group (or one rank exited or is stuck in a loop): "
    "check that every rank reaches this line."
)


@dataclass(frozen=True)
class ParallelContext:
    """Who this process is in the job. Pass it to whatever needs to communicate."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    timeout_s: float
    topology: Topology | None = None   # the named dimensions (dp, tp, pp) and their groups, when asked for
    emulator: Any = None                # `emulated.Emulator` when init(device="emulated:...") shapes time

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def with_layout(self, dp: int = 1, tp: int = 1, pp: int = 1, use_mesh: bool = False) -> ParallelContext:
        """This context with the groups of a dp × tp × pp grid (every rank must call it, with the same sizes)."""
        built = topology.build({"dp": dp, "tp": tp, "pp": pp}, self.device.type, use_mesh=use_mesh)
        return dataclasses.replace(self, topology=built)

    def _topology(self) -> Topology:
        if self.topology is None:
            raise ValueError("this context has no dp/tp/pp groups: create it with runtime.init(dp=..., tp=..., "
                             "pp=...) or ctx.with_layout(dp=..., tp=..., pp=...)")
        return self.topology

    def group(self, dim: str):
        """The process group of this rank along `dim` ("dp", "tp" or "pp")."""
        return self._topology().group(dim)

    def ranks(self, dim: str) -> list[int]:
        """The global ranks of this rank's group along `dim`, in order of that coordinate."""
        return self._topology().ranks[dim]

    @property
    def coords(self) -> dict[str, int]:
        return self._topology().coords


def _choose_backend(requested: str, local_world_size: int) -> str:
    if requested not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', not {requested!r}")
    if requested != "auto":
        return requested
    # NCCL needs one GPU per rank on this node; anything less (a laptop, a CI box) falls back to Gloo.
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size:
        return "nccl"
    return "gloo"


def init(backend: str = "auto", timeout: float | None = None, *, dp: int | None = None, tp: int | None = None,
         pp: int | None = None, use_mesh: bool = False, device: str | None = None) -> ParallelContext:
    """Create (or re-create) the default process group and return this rank's `ParallelContext`.

    `timeout` (seconds) bounds every collective: a teaching deadlock ends in an error that says what
    probably mismatched, instead of a frozen notebook. Default 60 s, or `--timeout` of the launcher.
    dp/tp/pp (any of them) also build the grid's groups (`topology.build`); a missing size is 1, except dp,
    which takes the ranks left over. `device="emulated:a100"` (see `partrain_edu.emulated`; default: the
    launcher's `--device`, else "cpu") shapes the time of compute and communication like that device's, a lens
    for seconds; the arithmetic stays this machine's.
    """
    emulator, device = None, device or os.environ.get(DEVICE_ENV, "cpu")
    if device != "cpu":   # parsed first: a bad spec is a one-line error before any group exists
        from partrain_edu import emulated

        emulator = emulated.parse(device, int(os.environ.get("RANK", 0)))
    if timeout is None:
        timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
    if backend == "auto":
        backend = os.environ.get(BACKEND_ENV, "auto")  # the launcher's --backend
    if timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    chosen = _choose_backend(backend, local_world_size)
    if chosen == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend 'nccl' needs a GPU per rank; use backend='gloo' on CPU")

    # A re-run cell (or a second init in one script) starts from a clean slate, never a stale group.
    shutdown()
    if chosen == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    kwargs: dict[str, Any] = dict(backend=chosen, timeout=datetime.timedelta(seconds=timeout))
    _fresh_group_names()
    if launched:
        dist.init_process_group(**kwargs)  # env:// rendezvous from torchrun's variables
    else:
        # Standalone: a world of one, rendezvous in memory (no port to pick, nothing to collide with).
        dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    _install_timeout_hint()
    if emulator is not None:
        from partrain_edu.emulated import links

        links.install(emulator)
    ctx = ParallelContext(rank, world_size, local_rank, device, chosen, timeout, emulator=emulator)
    if dp is None and tp is None and pp is None:
        return ctx
    tp, pp = tp or 1, pp or 1
    return ctx.with_layout(dp=dp or max(world_size // (tp * pp), 1), tp=tp, pp=pp, use_mesh=use_mesh)


_inits = {"count": 0}


def _fresh_group_names() -> None:
    """Give a re-init's groups names of their own. torch names the default group "0" on every init (destroying
    it resets the counter), so a second `init()` would look up the previous init's Gloo addresses under the same
    keys of torchrun's store and fail ("Connection refused") or hang when a peer had not replaced its own yet:
    seen in 1 re-init out of 3. Every rank inits the same number of times, so the names agree across ranks."""
    from torch.distributed import distributed_c10d

    if _inits["count"]:   # the first init keeps torch's own names
        distributed_c10d._world.group_count = 1000 * _inits["count"]
    _inits["count"] += 1


def shutdown() -> None:
    """Destroy the default process group if there is one. Safe to call any number of times."""
    if "partrain_edu.emulated" in sys.modules:   # a previous init's emulated links end with its group
        sys.modules["partrain_edu.emulated"].uninstall()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Seed Python, and torch (CPU and every GPU), so every rank draws the same numbers."""
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def print0(*args: Any, **kwargs: Any) -> None:
    """print() on global rank 0 only (every rank printing the same line is noise)."""
    if int(os.environ.get("RANK", 0)) == 0:
        print(*args, **kwargs, flush=True)


def publish(name: str, value: Any) -> None:
    """Hand `value` back to the notebook as the variable `name` (rank 0's value wins).

    Under `%%torchrun` / `torchrun()` the value is pickled to the launcher's folder and appears in the
    notebook's namespace when the cell finishes. Run standalone, it lands in `standalone_published`.
    Tensors are moved to the CPU first so the notebook (which may have no GPU) can unpickle them.
    """
    if not name.isidentifier():
        raise ValueError(f"publish name must be a Python identifier, got {name!r}")
    if int(os.environ.get("RANK", 0)) != 0:
        return
    value = _to_cpu(value)
    folder = os.environ.get(PUBLISH_DIR_ENV)
    if folder is None:
        standalone_published[name] = value
        return
    tmp = Path(folder) / f".{name}.tmp"
    with open(tmp, "wb") as f:
        pickle.dump(value, f)
    os.replace(tmp, Path(folder) / f"{name}.pkl")  # atomic: the launcher never reads half a value


standalone_published: dict[str, Any] = {}


def read_published(folder: str | os.PathLike) -> dict[str, Any]:
    """The launcher's side of `publish`: {name: value} of every value rank 0 published into `folder`. It unpickles,
    so only a trusted launcher calls it on its own run's folder (the grader reads ranks' data otherwise)."""
    published = {}
    for path in sorted(Path(folder).glob("*.pkl")):
        with open(path, "rb") as f:
            published[path.stem] = pickle.load(f)
    return published


def publish_every_rank(name: str, record: Any, group=None) -> list:
    """Gather `record` from every rank of `group` (default: the world) with `all_gather_object` and publish the
    list as `name`, rank r's record at index r: `publish` hands back rank 0's value only, a lesson comparing ranks
    needs each one's. Every rank of the group calls it, like any collective; call it after a CommTracer's block,
    not inside it, or the tracer records this gather as well."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, record, group=group)
    publish(name, everyone)
    return everyone


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _install_timeout_hint() -> None:
    """Append `TIMEOUT_HINT` to an uncaught collective-timeout error (Gloo and NCCL word it differently)."""
    if getattr(sys.excepthook, "_partrain_hint", False):
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if is_timeout_error(exc) and TIMEOUT_HINT not in str(exc):
            print(f"\n{TIMEOUT_HINT}", file=sys.stderr)
        previous(exc_type, exc, tb)

    hook._partrain_hint = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def is_timeout_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, (RuntimeError, dist.DistBackendError)) and ("timed out" in text or "timeout" in text)
