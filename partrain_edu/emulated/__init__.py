"""An emulated accelerator and links: seconds on a laptop shaped like a GPU cluster's — a lens for time.

    ctx = runtime.init(device="emulated:a100")            # or "emulated:h100,node=2,net=1gbe,scale=40,slow=3:1.5"
    ctx.emulator.charge(block, seconds=layer_forward_seconds(MODELS["gpt-1.3b"], "a100", samples))  # per forward

Each rank keeps an **emulated clock** (`now()`, the same origin on every rank). It advances only by what the
device would spend: a charged module's forward `seconds`, its backward twice that (compute.py), and every
torch.distributed call's k·(steps·α + bytes·scale/β) on its group's links (links.py), with (α, β) =
`theory.network.group_link` — NVLink inside a node of `node` ranks; across nodes the NICs (or `net`) of the
group's members on each node, at NCCL's measured efficiency. `bytes_scale` (or a `traffic` rule for a group) turns
real bytes into the named model's; a rule's k > 1 applies inside a charged module (one real message stands for k
layers'). One communication stream per rank; the real arithmetic still runs (losses stay exact) and a rank sleeps
as long as its clock advanced, so 8 ranks on 2 cores keep the emulated rhythm and timelines do not depend on load.
`scale`: wall seconds per emulated second; `slow=R:F` makes rank R's compute F× slower (a straggler).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from partrain_edu.theory.hardware import PRESETS, Device, canonical, device_named
from partrain_edu.theory.network import group_link
from partrain_edu.theory.traffic import collective_time

PREFIX = "emulated:"
NETS = ("infiniband", "10gbe", "1gbe")


@dataclass
class Emulator:
    device: Device
    rank: int = 0
    scale: float = 1.0                 # wall seconds per emulated second
    auto_scale: bool = True            # no scale=S in the spec: whoever charges the work may choose it
    node: int = 8                      # ranks per emulated node
    net: str = "infiniband"            # the link between nodes
    slow: dict[int, float] = field(default_factory=dict)
    preset: str = ""                   # the device's `hardware.PRESETS` key ("" → looked up from `device`)
    bytes_scale: float = 1.0           # bytes charged per real byte sent (the named shape's messages)
    # (kind "p2p" | "collective", the group's ranks) → (bytes per real byte, messages per real message inside a
    # charged module): a group whose messages are not the default's (tensor parallelism's activations)
    traffic: dict[tuple[str, tuple[int, ...]], tuple[float, float]] = field(default_factory=dict)
    inside: int = 0                    # charged modules whose forward or backward is running now (compute.py)
    clock: float = 0.0                 # this rank's emulated time, in perf_counter seconds (see links.install)
    stream_free: float = 0.0           # when this rank's communication stream is next idle
    charged_s: float = 0.0             # clock seconds spent in charged compute
    real_s: float = 0.0                # wall seconds the real arithmetic took inside those windows
    comm_s: float = 0.0                # clock seconds of communication on the stream
    anchor: tuple[float, float] = (0.0, 0.0)   # (clock, wall) at the last point every rank agreed on
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def compute_factor(self) -> float:
        return self.slow.get(self.rank, 1.0)

    def now(self) -> float:
        """This rank's emulated time (perf_counter units, a common origin on every rank)."""
        return self.clock

    def synced(self, t: float) -> None:
        """Every rank agreed that the clock reads `t` now (a collective): pace from here."""
        self.anchor = (t, time.perf_counter())

    def advance_to(self, t: float) -> None:
        """The clock moves to `t` if later; then wait, sleeping, until as much wall time has passed since the last
        agreed point as clock time has (untimed work the machine did meanwhile is not charged twice)."""
        with self.lock:
            self.clock = max(self.clock, t)
            target = self.anchor[1] + (self.clock - self.anchor[0])
        while (left := target - time.perf_counter()) > 0:
            time.sleep(left)

    def compute(self, seconds: float) -> None:
        """Spend `seconds` of emulated compute now: the clock moves past it before the real work runs, so what
        the work triggers (a gradient hook issuing an all-reduce) happens when the emulated work has ended."""
        cost = seconds * self.compute_factor * self.scale
        self.charged_s += cost
        self.advance_to(self.clock + cost)

    @property
    def name(self) -> str:
        """The preset key the calibrated model knows this device by ("a100-80gb")."""
        return self.preset or next(k for k, d in PRESETS.items() if d == self.device)

    def link_of(self, ranks) -> tuple[str, float, float]:
        """(name, α, β) of a ring over `ranks`, priced as the calibrated model prices it (`theory.network`): NVLink
        when one node holds them all, else the network with the fewest of them any node holds sharing its NICs."""
        ranks = tuple(ranks)
        nodes = [r // self.node for r in ranks]
        per_node = min(nodes.count(n) for n in set(nodes))
        link = group_link(self.device, len(ranks), len(ranks) if len(set(nodes)) == 1 else per_node, self.net)
        return link.fabric, link.alpha, link.beta

    def scale_of(self, kind: str, ranks) -> tuple[float, float]:
        """(bytes per real byte, messages per real message) of a `kind` message on the group of `ranks` now."""
        per_byte, per_layer = self.traffic.get((kind, tuple(ranks)), (self.bytes_scale, 1.0))
        return per_byte, per_layer if self.inside else 1.0

    def collective_seconds(self, op: str, nbytes: int, ranks) -> float:
        """The α–β model's seconds for `op` of `nbytes` over `ranks`, on their slowest link (no bytes_scale)."""
        _, alpha, beta = self.link_of(tuple(ranks))
        return collective_time(op, int(nbytes), len(tuple(ranks)), alpha=alpha, beta=beta)

    def charge(self, module, seconds: float):
        """Charge `module`'s every forward `seconds` and its backward twice that (compute.py)."""
        from partrain_edu.emulated.compute import charge

        return charge(self, module, seconds)

    def report(self) -> dict:
        """Charged compute and communication in emulated seconds, and the real CPU time hidden in the compute."""
        return {"device": self.device.name, "scale": self.scale, "compute_s": self.charged_s / self.scale,
                "comm_s": self.comm_s / self.scale, "real_compute_wall_s": self.real_s,
                "dominance": self.charged_s / self.real_s if self.real_s else float("inf")}


def parse(spec: str, rank: int = 0) -> Emulator:
    """`emulated:NAME[,node=N][,net=infiniband|10gbe|1gbe][,scale=S][,slow=R:F]` → an Emulator (one-line errors)."""
    if not isinstance(spec, str) or not spec.startswith(PREFIX):
        raise ValueError(f"device must be 'cpu' or '{PREFIX}<name>' (e.g. {PREFIX}a100), got {spec!r}")
    name, *options = spec[len(PREFIX):].split(",")
    emulator = Emulator(device_named(name), rank=rank, preset=canonical(name))
    for option in options:
        key, _, value = option.partition("=")
        try:
            if key == "node":
                emulator.node = int(value)
            elif key == "scale":
                emulator.scale, emulator.auto_scale = float(value), False
            elif key == "net" and value in NETS:
                emulator.net = value
            elif key == "slow":
                r, f = value.split(":")
                emulator.slow[int(r)] = float(f)
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"bad emulated-device option {option!r} in {spec!r}: use node=N, net="
                             f"{'|'.join(NETS)}, scale=S or slow=RANK:FACTOR") from None
    if emulator.node < 1 or not 0 < emulator.scale < 1e6 or any(not 0 < f < 1e3 for f in emulator.slow.values()):
        raise ValueError(f"in {spec!r}: node must be ≥ 1, scale and slow factors positive and below 10^6")
    return emulator


def uninstall() -> None:
    from partrain_edu.emulated import links

    links.uninstall()
