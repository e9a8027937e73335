"""`TrainConfig`: what one `partrain-edu train` run trains, and the command-line flags derived from it.

    partrain-edu train --strategy 3d --nproc 8 --dp 2 --tp 2 --pp 2 --microbatches 2 --steps 20 --seed 0

Every field except `model` is one flag, named after it (`global_batch` → `--global-batch`). The parser
(`add_train_arguments`), its inverse (`config_from_args`) and the argv a rank is started with (`to_argv`) all
read `dataclasses.fields(TrainConfig)`, so a new setting is one new field here. No torch import: `partrain-edu
memory` builds the same parser and must stay instant.
"""
# No `from __future__ import annotations`: the flags' types are read from the fields' real annotations.
import argparse
import dataclasses
import typing
from dataclasses import dataclass, field

if typing.TYPE_CHECKING:
    from partrain_edu.models import GPTConfig


def _default_model() -> "GPTConfig":
    from partrain_edu.models import GPTConfig  # torch: paid when a run is configured, not when a parser is built

    return GPTConfig()


# Upper limits, and why: past them a run takes minutes per step, exhausts memory, or overflows a generator.
LIMITS = {
    "global_batch": (1024, "1024 sequences already take ≈ 1 GB and seconds per step on a CPU"),
    "nproc": (64, "every rank is a whole process on this one machine"),
    "seed": (2**32 - 1, "random generators take 32-bit seeds"),
}


@dataclass(frozen=True)
class TrainConfig:
    # In the order `--help` lists them. `metadata`: the flag's help and whether the CLI requires it.
    strategy: str = field(default="single", metadata={
        "required": True, "help": "single, torch-ddp, ... (an unknown name lists them)"})
    nproc: int = field(default=1, metadata={"help": "number of processes (ranks)"})
    dp: int | None = None
    tp: int | None = None
    pp: int | None = None
    cp: int | None = field(default=None, metadata={
        "help": "context-parallel degree: the sequence split over this many ranks (ring attention)"})
    microbatches: int = 1
    steps: int = 20
    seed: int = 0
    global_batch: int = 16
    device: str = field(default="cpu", metadata={
        "help": "cpu, or emulated:a100 / emulated:h100[,node=N,net=1gbe,scale=S] to time the run as on that "
                "device (a lens for seconds; the arithmetic stays this machine's)"})
    model: "GPTConfig" = field(default_factory=_default_model, metadata={"flag": False})  # not on the CLI

    def __post_init__(self):
        for name in ("nproc", "steps", "global_batch", "microbatches"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        for name in ("dp", "tp", "pp", "cp"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"--{name} must be a positive integer, got {getattr(self, name)}")
        if self.seed < 0:
            raise ValueError(f"--seed must be non-negative, got {self.seed}")
        if (self.cp or 1) > 1 and self.strategy != "cp":
            raise ValueError(f"--cp {self.cp} shards the sequence, which only --strategy cp does: drop --cp or use "
                             f"--strategy cp")
        if self.device != "cpu":
            from partrain_edu.emulated import parse  # no torch: the spec is checked before any process starts

            parse(self.device)
        for name, (limit, why) in LIMITS.items():
            if getattr(self, name) > limit:
                raise ValueError(f"--{name.replace('_', '-')} must be at most {limit}, got {getattr(self, name)}: "
                                 f"{why}")


def _flag_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(TrainConfig) if f.metadata.get("flag", True)]


def _flag(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def _value_type(f: dataclasses.Field) -> type:
    """`int` for `int | None`: None is the default, never typed on the command line."""
    return next(t for t in typing.get_args(f.type) or (f.type,) if t is not type(None))


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    for f in _flag_fields():
        if f.metadata.get("required"):
            parser.add_argument(_flag(f), required=True, help=f.metadata.get("help"))
        else:
            parser.add_argument(_flag(f), type=_value_type(f), default=f.default, help=f.metadata.get("help"))


def config_from_args(args: argparse.Namespace, **overrides) -> TrainConfig:
    """The TrainConfig of parsed flags; `model=` replaces the default model (train_checks: one without torch)."""
    return TrainConfig(**{f.name: getattr(args, f.name) for f in _flag_fields()}, **overrides)


def to_argv(cfg: TrainConfig) -> list[str]:
    """The flags that rebuild `cfg` through `add_train_arguments` (unset sizes left out, as on the CLI)."""
    return [f"{_flag(f)}={getattr(cfg, f.name)}" for f in _flag_fields() if getattr(cfg, f.name) is not None]
