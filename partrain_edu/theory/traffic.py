"""Bytes each rank sends in one training step, per strategy and per collective (ring cost model).

    partrain-edu traffic --strategy ddp --params 1.3B --dp 8 --json
    partrain-edu traffic --strategy tp --tp 8 --layers 24 --hidden 2048 --seq 2048 --micro-batch 1

**Ring cost model** (Patarasuk & Yuan 2009; what NCCL's ring algorithm sends). For a collective whose full
tensor is S bytes over a group of n ranks, each rank sends

    all_reduce       2(n−1)/n · S      (a reduce-scatter then an all-gather)
    all_gather       (n−1)/n · S       (S is the gathered, full tensor)
    reduce_scatter   (n−1)/n · S       (S is the full tensor before scattering)
    broadcast        S                 (pipelined ring: every rank but the last forwards all of it)
    send             S                 (point to point)

rounded up to whole bytes. A collective over one rank sends nothing and is left out. In the output,
``bytes_per_call`` is the payload S of one call, and ``per_rank_bytes_sent`` adds up the bytes above.

**Per strategy**, Ψ parameters of b bytes each (``--bytes-per-element``, default 2 = 16-bit), m micro-batches
per step (gradient accumulation):

- ``ddp``: one all-reduce of the gradients, 2(n−1)/n · Ψb ≈ 2Ψb (ZeRO paper §7.1). PyTorch DDP splits it into
  25 MB buckets to overlap with backward; the bytes are the same, so we show one call.
- ``zero1``: reduce-scatter the gradients, all-gather the updated parameters: the same 2Ψb as DDP (§7.2.1).
- ``zero2``: as zero1, but the gradients are sharded, so they are reduce-scattered every micro-batch
  (m reduce-scatters), not accumulated whole (§7.2.1 with gradient accumulation).
- ``zero3``: the parameters are sharded, so every micro-batch all-gathers them for forward and again for
  backward, and reduce-scatters its gradients: 3Ψb per micro-batch = 1.5× DDP at m = 1 (§7.2.2).
  (Real ZeRO-3/FSDP gather one layer at a time; the bytes are the same, so we show the whole model.)
- ``tp``: Megatron's f/g operators (Shoeybi et al. 2019, §3, Figure 4): per layer per micro-batch two
  all-reduces of the b·s·h activations in forward (after attention and after the MLP) and two in backward,
  over the tp group; l/pp layers per rank.
- ``pp``: each micro-batch's boundary activations b·s·h go forward to the next stage and their gradient
  comes back: a middle stage sends 2m messages, the first and last stage m (we report the busiest rank).
- ``cp``: ring attention (Liu et al. 2023) over c ranks, each holding s/c positions: per layer per micro-batch
  its K and V blocks, 2·b·(s/c)·h·e/t bytes, hop c−1 times forward; backward re-sends them and sends the dK, dV
  accumulators as many times: (c−1)/c · 2bshe/t forward, twice that backward (:func:`cp_bytes_per_layer`).
  With ``params``, the replicated gradients' all-reduce over the c ranks is added.

With ``--tp``/``--pp`` given to ``ddp``/``zero*``, the data-parallel collectives carry one model-parallel
shard, Ψ/(tp·pp) parameters (as in memory.py). **Link time** (Hockney's α–β model): :func:`link_time` and
:func:`collective_time` charge α per message (per ring step: 2(n−1) for an all-reduce) plus bytes over the
link's one-direction bandwidth β — still a lower bound: no protocol overhead, no overlap with compute. A group
spread over nodes runs on several links at once: `theory.network` prices it (its members on a node share their
NICs), and the calibrated model, the planner and the emulated device use that.
"""

from __future__ import annotations

from dataclasses import dataclass

from partrain_edu.units import format_bytes, parse_size

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "tp", "pp", "cp")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send")

# Bytes per second in one direction, per GPU.
LINKS = {
    # one generation, so the ratios between them are an H100 cluster's (an A100's: hardware.DEVICES["a100"])
    "nvlink": 450e9,      # NVLink 4 (H100 SXM): 900 GB/s bidirectional = 450 GB/s each way
    "infiniband": 50e9,   # InfiniBand NDR: 400 Gb/s per port = 50 GB/s, one port per GPU (DGX H100)
    "10gbe": 1.25e9,      # 10 Gb Ethernet
    "1gbe": 0.125e9,      # 1 Gb Ethernet: the source notes' "data parallel basically cannot run"
}


# α: seconds per message (per ring step), Hockney's latency term. Orders of magnitude, not measurements: NCCL's
# small-message all-reduce on NVLink takes some µs per ring step; an InfiniBand round trip a few µs; a TCP
# message over Ethernet tens of µs. `benchmarks/alpha_beta.py` fits Gloo's on this machine.
LATENCY = {"nvlink": 3e-6, "infiniband": 5e-6, "10gbe": 30e-6, "1gbe": 50e-6}


def ring_steps(op: str, group_size: int) -> int:
    """Messages each rank sends one after another for ``op`` over a ring of ``group_size`` ranks: the α count."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    n = group_size
    if n == 1:
        return 0
    return {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1, "broadcast": n - 1,
            "send": 1}[op]


def collective_time(op: str, payload_bytes: int, group_size: int, link: str | None = None, *,
                    alpha: float | None = None, beta: float | None = None) -> float:
    """α–β time of one ``op``: ring_steps·α + ring_bytes_sent/β, with α, β those of ``link`` unless given.
    (A pipelined broadcast overlaps its n−1 hops: we charge them, an upper bound for small messages.)"""
    if link is not None and link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    alpha = LATENCY[link] if alpha is None else alpha
    beta = LINKS[link] if beta is None else beta
    return ring_steps(op, group_size) * alpha + ring_bytes_sent(op, payload_bytes, group_size) / beta


def fit_alpha_beta(samples: list[tuple[str, int, int, float]]) -> tuple[float, float, float]:
    """Least-squares α (s per message) and β (bytes/s) from measured collectives, each (op, payload bytes,
    group size, seconds), under t = ring_steps·α + ring_bytes_sent/β; also the fit's relative RMS error."""
    rows = [(ring_steps(op, n), ring_bytes_sent(op, size, n), t) for op, size, n, t in samples]
    if len(rows) < 2 or any(t <= 0 for *_, t in rows):
        raise ValueError("need at least two timed collectives, each with a positive time")
    # Normal equations of min Σ ((a·k + b·x − t)/t)²: relative errors, so small messages count as much as big ones.
    w = [(k / t, x / t) for k, x, t in rows]        # each row: a·(k/t) + b·(x/t) ≈ 1
    skk = sum(k * k for k, _ in w)
    skx = sum(k * x for k, x in w)
    sxx = sum(x * x for _, x in w)
    sk, sx = sum(k for k, _ in w), sum(x for _, x in w)
    det = skk * sxx - skx * skx
    if det <= 0:
        raise ValueError("the samples cannot separate α from β: vary both the message size and the group size")
    alpha, inv_beta = (sk * sxx - sx * skx) / det, (sx * skk - sk * skx) / det
    if alpha <= 0 or inv_beta <= 0:
        raise ValueError(f"the fit gave α = {alpha:.3g} s, 1/β = {inv_beta:.3g} s/B: too noisy; time more repeats")
    error = (sum(((alpha * k + inv_beta * x) / t - 1) ** 2 for k, x, t in rows) / len(rows)) ** 0.5
    return alpha, 1 / inv_beta, error


def bucketed_backward_end(backward_s: float, bucket_comm_s: list[float], ready_s: list[float] | None = None) -> float:
    """When DDP's last all-reduce ends, from the start of backward: bucket i becomes ready at `ready_s[i]` (by
    default evenly through a backward of `backward_s`, at (i+1)/k of it) and the buckets run one after another on
    one stream. For k equal buckets of total C this is max(B + C/k, B/k + C): overlap saves (1 − 1/k)·min(B, C)
    against one all-reduce of the same bytes after backward (Li et al. 2020, PyTorch Distributed, §3.2.3), minus
    the extra buckets' α."""
    k, end = len(bucket_comm_s), 0.0
    ready_s = ready_s if ready_s is not None else [backward_s * (i + 1) / k for i in range(k)]
    for ready, comm in zip(ready_s, bucket_comm_s, strict=True):
        end = max(ready, end) + comm
    return max(end, backward_s)


def ring_bytes_sent(op: str, payload_bytes: int, group_size: int) -> int:
    """Bytes one rank sends for one ``op`` on a full tensor of ``payload_bytes`` over ``group_size`` ranks."""
    if op not in OPS:
        raise ValueError(f"op must be one of {', '.join(OPS)}, got {op!r}")
    if payload_bytes < 0 or group_size < 1:
        raise ValueError(f"need payload_bytes >= 0 and group_size >= 1, got {payload_bytes}, {group_size}")
    n = group_size
    if n == 1:
        return 0
    if op in ("broadcast", "send"):
        return payload_bytes
    factor = 2 if op == "all_reduce" else 1
    return -(-factor * (n - 1) * payload_bytes // n)  # ⌈factor·(n−1)/n·S⌉


def link_time(nbytes: int, link: str, messages: int = 0) -> float:
    """Seconds to send ``nbytes`` over ``link`` (a key of LINKS) in ``messages`` messages: messages·α + S/β.
    With the default messages = 0, bandwidth only: a lower bound."""
    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(LINKS)}, got {link!r}")
    return messages * LATENCY[link] + nbytes / LINKS[link]


@dataclass(frozen=True)
class Collective:
    """``count`` calls of ``op``, each on a full tensor of ``bytes_per_call`` bytes over ``group_size`` ranks."""

    op: str
    count: int
    bytes_per_call: int
    group_size: int

    @property
    def bytes_sent(self) -> int:
        return self.count * ring_bytes_sent(self.op, self.bytes_per_call, self.group_size)


@dataclass(frozen=True)
class StepTraffic:
    strategy: str
    collectives: tuple[Collective, ...]

    @property
    def per_rank_bytes_sent(self) -> int:
        return sum(c.bytes_sent for c in self.collectives)

    def to_dict(self) -> dict:
        """The ``traffic --json`` object."""
        return {"per_rank_bytes_sent": self.per_rank_bytes_sent,
                "collectives": [{"op": c.op, "count": c.count, "bytes_per_call": c.bytes_per_call}
                                for c in self.collectives]}

    def table(self) -> str:
        lines = [f"{self.strategy}: one training step, bytes the busiest rank sends (ring model)",
                 f"  {'op':<15}{'calls':>7}{'payload':>12}{'group':>7}{'sent':>12}"]
        lines += [f"  {c.op:<15}{c.count:>7}{format_bytes(c.bytes_per_call):>12}{c.group_size:>7}"
                  f"{format_bytes(c.bytes_sent):>12}" for c in self.collectives]
        total = self.per_rank_bytes_sent
        lines.append(f"  total sent per rank: {format_bytes(total)}; at least, over")
        lines += [f"    {name:<11}{link_time(total, name):>12.4g} s" for name in LINKS]
        return "\n".join(lines)


def cp_bytes_per_layer(*, seq: int, micro_batch: int, hidden: int, cp: int, tp: int = 1,
                       bytes_per_element: int = 2) -> dict[str, int]:
    """Bytes one rank sends around the context-parallel ring for one layer and micro-batch, per pass: forward its
    K, V blocks c−1 hops, (c−1)/c of the whole K and V; backward those again plus the dK, dV accumulators."""
    _need("cp", seq=seq, micro_batch=micro_batch, hidden=hidden, cp=cp, tp=tp, bytes_per_element=bytes_per_element)
    if seq % cp or hidden % tp:
        raise ValueError(f"--cp {cp} must divide --seq {seq} and --tp {tp} --hidden {hidden}")
    block = 2 * micro_batch * (seq // cp) * (hidden // tp) * bytes_per_element   # this rank's K and V
    return {"forward": (cp - 1) * block, "backward": 2 * (cp - 1) * block}


def _need(strategy: str, **given) -> None:
    missing = [name for name, value in given.items() if value is None]
    if missing:
        flags = " ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"--strategy {strategy} needs {flags} (missing "
                         f"{' '.join('--' + m.replace('_', '-') for m in missing)})")
    for name, value in given.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive whole number, got {value!r}")


def step_traffic(strategy: str, params: int | float | str | None = None, *, dp: int = 1, tp: int = 1, pp: int = 1,
                 cp: int = 1, layers: int | None = None, hidden: int | None = None, seq: int | None = None,
                 micro_batch: int | None = None, microbatches: int = 1,
                 bytes_per_element: int = 2) -> StepTraffic:
    """What the busiest rank sends in one step under ``strategy``; the ``traffic`` subcommand."""
    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    _need(strategy, dp=dp, tp=tp, pp=pp, cp=cp, microbatches=microbatches, bytes_per_element=bytes_per_element)
    m, b = microbatches, bytes_per_element
    if strategy in ("ddp", "zero1", "zero2", "zero3"):
        if isinstance(params, (str, float)):  # notebooks may say 7.5e9 or "7.5B"
            params = parse_size(params)
        _need(strategy, params=params)
        shard = -(-params // (tp * pp)) * b  # S: one model-parallel shard's gradients (or weights)
        plan = {"ddp": [("all_reduce", 1)],
                "zero1": [("reduce_scatter", 1), ("all_gather", 1)],
                "zero2": [("reduce_scatter", m), ("all_gather", 1)],
                "zero3": [("all_gather", 2 * m), ("reduce_scatter", m)]}[strategy]
        calls = [Collective(op, count, shard, dp) for op, count in plan]
    elif strategy == "tp":
        _need(strategy, layers=layers, hidden=hidden, seq=seq, micro_batch=micro_batch)
        if layers % pp:
            raise ValueError(f"--layers {layers} is not divisible by --pp {pp}; pick --pp that divides --layers")
        activation = micro_batch * seq * hidden * b
        calls = [Collective("all_reduce", 4 * (layers // pp) * m, activation, tp)]
    elif strategy == "cp":
        _need(strategy, layers=layers, hidden=hidden, seq=seq, micro_batch=micro_batch)
        if cp < 2:
            raise ValueError(f"--strategy cp needs --cp 2 or more (the ranks that share each sequence), got {cp}")
        if layers % pp:
            raise ValueError(f"--layers {layers} is not divisible by --pp {pp}; pick --pp that divides --layers")
        per_layer = cp_bytes_per_layer(seq=seq, micro_batch=micro_batch, hidden=hidden, cp=cp, tp=tp,
                                       bytes_per_element=b)
        block = per_layer["forward"] // max(cp - 1, 1)   # one hop's message: this rank's K and V
        calls = [Collective("send", 3 * (cp - 1) * (layers // pp) * m, block, cp)]
        if params is not None:
            params = parse_size(params) if isinstance(params, (str, float)) else params
            calls.append(Collective("all_reduce", 1, -(-params // (tp * pp)) * b, cp))
    else:  # pp
        _need(strategy, hidden=hidden, seq=seq, micro_batch=micro_batch)
        activation = micro_batch * seq * hidden * b
        sends = 2 * m if pp >= 3 else m  # a middle stage sends both directions
        calls = [Collective("send", sends, activation, pp)]
    return StepTraffic(strategy, tuple(c for c in calls if c.bytes_sent > 0))
