"""The trusted model of exercise 13's check (communication_bounds.py): the closed forms, exactly, and the 7 cases
per check a run draws from its seed (trials.py) — devices and links from `theory.hardware` and `theory.network`, Ψ,
tokens, widths, degrees — each with its bound safely away from a whole number, or hit exactly. Registers no check.
Its text states the exercise's answers, so the sandbox empties it too (headless/view.py, EMPTIED).
"""
from __future__ import annotations

import math
from fractions import Fraction

from partrain_edu.grading.trials import stream
from partrain_edu.theory.hardware import PRESETS
from partrain_edu.theory.network import DATASHEET, EFFICIENCY, group_link

SEQ = (1024, 2048, 4096, 8192)
WIDTHS = (2048, 2560, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 16384, 18432, 20480, 25600)
NODES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512)
DEGREES = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096)


# --- the closed forms, exactly: Fraction(x) is a float's exact binary value ---------------------------------

def dp_slack(params, tokens, flops, bandwidth) -> Fraction:
    """The bound on N − 1 for DDP and ZeRO-3: (N−1)·F ≤ T·β."""
    return Fraction(tokens) * Fraction(bandwidth) / Fraction(flops)


def tp_slack(hidden, tokens, flops, bandwidth) -> Fraction:
    """The bound on t − 1 for Megatron TP: 2 · 2(t−1)/t · 2bsh / β ≤ 24bsh²/(tF) ⇔ (t−1)·F ≤ 3hβ."""
    return 3 * Fraction(hidden) * Fraction(bandwidth) / Fraction(flops)


def largest_degree(slack: Fraction) -> int:
    return 1 + math.floor(slack)


def batch_need(degree, seq, flops, bandwidth) -> Fraction:
    """Sequences (over all N devices) from which DDP's all-reduce fits in backward: (N−1)·F/(s·β)."""
    return (degree - 1) * Fraction(flops) / (Fraction(seq) * Fraction(bandwidth))


def min_batch(degree, seq, flops, bandwidth, factor: Fraction = Fraction(1)) -> int:
    """The smallest multiple B of N from `factor` × `batch_need` on, and at least one sequence per device."""
    return degree * max(1, math.ceil(factor * batch_need(degree, seq, flops, bandwidth) / degree))


# --- the run's cases: (what, arguments) ------------------------------------------------------------------------

def hardware(rng, across: bool) -> tuple[float, float, str]:
    """(F, β, what): a device of theory.hardware at peak or a sustained share, and the β a ring gives each member
    inside a node (NVLink) or `across` nodes with 1, 2, 4 or 8 members per node (theory.network.group_link)."""
    device = PRESETS[rng.choice(sorted(PRESETS))]
    share = rng.choice((1.0, 1.0, round(rng.uniform(0.3, 0.8), 2)))
    shares, which = rng.choice(((DATASHEET, "datasheet"), (EFFICIENCY, "NCCL's share")))
    if across:
        per_node = rng.choice((1, 1, 2, 4, 8))
        link = group_link(device, per_node * rng.choice(NODES), per_node, efficiency=shares)
        where = f"{per_node} member{'s' * (per_node > 1)} per node over the NICs"
    else:
        link, where = group_link(device, 8, 8, efficiency=shares), "inside a node over NVLink"
    return (device.peak_flops * share, link.beta,
            f"{device.name} at {share:.0%} of peak, {where} ({which}, {link.beta / 1e9:.4g} GB/s)")


def _drawn(rng, make, bound, low=0, high=math.inf, across=None, upper_half=False, keep=None) -> tuple[str, tuple]:
    """A case from `make(F, β)` whose bound lies in [low, high), safely away from a whole number (float rounding
    cannot carry it over), with a fraction above ½ when asked, and `keep(args)` when given."""
    while True:
        flops, beta, what = hardware(rng, rng.random() < 0.6 if across is None else across)
        args = make(flops, beta)
        value = bound(*args)
        if low <= value < high and abs(value - round(value)) > 1e-6 and (not upper_half or value % 1 > 0.5) \
                and (keep is None or keep(args)):
            return what, args


def _tie(rng, make) -> tuple[str, tuple]:
    """A case at its bound exactly. F = 2^a FLOP/s and β = b·2^c B/s (b odd and small): then T·β/F, T·(β/F),
    3·h·β/F and the like are exact in floats, whatever order a solution multiplies in. `make(F, β)` gives the
    arguments, or None when these F and β cannot hit its bound."""
    while True:
        a = rng.randint(48, 50)
        b = rng.randrange(1, 16, 2)
        c = rng.randint(30, 39)
        flops, beta = 2.0**a, float(b * 2**c)
        args = make(flops, beta) if 20e9 <= beta <= 460e9 else None
        if args is not None:
            return (f"F = 2^{a} FLOP/s ({flops / 1e12:.4g} TFLOP/s), β = {b}·2^{c} B/s ({beta / 1e9:.4g} GB/s): the "
                    "bound hit exactly", args)


def dp_cases(seed: int, name: str) -> list[tuple[str, tuple]]:
    """DP's or FSDP's cases, (Ψ, T, F, β): a pair differing only in Ψ first."""
    rng = stream(seed, name)

    def psi():
        return int(10 ** rng.uniform(8, 12))

    def make(flops, beta, most=4096):
        return psi(), rng.randint(1, most) * rng.choice(SEQ), flops, beta

    def at_tie(flops, beta):   # T = K·F/β whole tokens, Ψ a power of two
        tokens = rng.randint(3, 400) * Fraction(flops) / Fraction(beta)
        return (2 ** rng.randint(27, 39), int(tokens), flops, beta) if tokens.denominator == 1 and \
            10**4 <= tokens <= 4 * 10**7 else None

    what, (p, t, f, b) = _drawn(rng, make, dp_slack, low=8)
    other = int(p * 10 ** rng.choice((-1, 1)) * rng.uniform(0.8, 5))
    return [(what, (p, t, f, b)), (f"{what}; as the case before but Ψ = {other:,}", (other, t, f, b)),
            _drawn(rng, make, dp_slack, low=3, upper_half=True),
            _drawn(rng, lambda f, b: make(f, b, most=8), dp_slack, high=1, across=True),
            _drawn(rng, make, dp_slack, low=8), _drawn(rng, make, dp_slack, low=8),
            _tie(rng, at_tie)]


def tp_cases(seed: int) -> list[tuple[str, tuple]]:
    """TP's cases, (h, b·s, F, β): a pair differing only in the tokens first."""
    rng = stream(seed, "max_tp_degree")

    def make(flops, beta):
        return rng.choice(WIDTHS), rng.randint(1, 16) * rng.choice(SEQ), flops, beta

    def at_tie(flops, beta):   # a width whose 3hβ/F is whole
        hidden = rng.choice(WIDTHS)
        whole = tp_slack(hidden, 0, flops, beta)
        return (hidden, rng.randint(1, 16) * rng.choice(SEQ), flops, beta) if whole.denominator == 1 and \
            whole >= 2 else None

    what, (h, t, f, b) = _drawn(rng, make, tp_slack, low=6, across=False)
    other = rng.choice([n * s for n in range(1, 17) for s in SEQ if n * s != t])
    return [(what, (h, t, f, b)), (f"{what}; as the case before but {other:,} tokens", (h, other, f, b)),
            _drawn(rng, make, tp_slack, low=3, across=False, upper_half=True),
            _drawn(rng, make, tp_slack, high=1, across=True),
            _drawn(rng, make, tp_slack, low=6, across=False), _drawn(rng, make, tp_slack, low=2),
            _tie(rng, at_tie)]


def batch_cases(seed: int) -> list[tuple[str, tuple]]:
    """The batch's cases, (N, s, F, β)."""
    rng = stream(seed, "min_dp_batch")

    def make(flops, beta, n=None):
        return n or rng.choice(DEGREES), rng.choice(SEQ), flops, beta

    def per_device(n, seq, flops, beta):
        return batch_need(n, seq, flops, beta) / n

    def at_tie(flops, beta):   # whole sequences per device, N a power of two: (N−1)/N is exact too
        n, seq = rng.choice((4, 8, 16, 32, 64, 128, 256)), rng.choice(SEQ)
        m = per_device(n, seq, flops, beta)
        return (n, seq, flops, beta) if m.denominator == 1 and 1 <= m <= 32 else None

    return [_drawn(rng, make, per_device, low=4, across=True), _drawn(rng, make, per_device, low=4, across=True),
            _drawn(rng, lambda f, b: make(f, b, n=rng.choice((2, 3, 4))), per_device, low=1.2, high=4,
                   upper_half=True, keep=lambda a: math.ceil(a[2] / (a[1] * a[3])) != math.ceil(per_device(*a))),
            _drawn(rng, make, per_device, high=1, across=False),
            _drawn(rng, lambda f, b: make(f, b, n=1), lambda *a: Fraction(1, 2)),
            _drawn(rng, make, per_device), _tie(rng, at_tie)]
