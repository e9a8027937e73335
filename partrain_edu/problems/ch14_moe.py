"""Problems of chapter 14 (mixture of experts): capacity, dropped assignments, the Switch aux loss, the busiest
expert's pace, and what an exact-count all-to-all saves against a capacity-padded one.

Keys come from `theory.moe` (capacity, kept_rows, dropped, switch_aux_loss, imbalance, dispatch_bytes,
padded_dispatch_bytes), the functions notebook 14 checks its layer and its all-to-alls against.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.moe import (
    capacity,
    dispatch_bytes,
    dropped,
    imbalance,
    kept_rows,
    padded_dispatch_bytes,
    switch_aux_loss,
)

GSHARD = "Lepikhin et al. 2020 (GShard) §2.2; Fedus et al. 2021 (Switch Transformer) §2.1"


def _loads(rng, experts: int, k: int) -> list[int]:
    """Rows routed to each expert from one group: uneven, one or two experts hot, N·k in all (N whole)."""
    load = [rng.randint(40, 160) for _ in range(experts)]
    for hot in rng.sample(range(experts), rng.choice([1, 2])):
        load[hot] += rng.randint(80, 200)
    load[0] += sum(load) % k
    return load


def _over(rng, experts: int, k: int, cf: float) -> list[int]:
    """Loads of a group (N = Σ load / k tokens) whose hot experts overflow: at least 3 % of them dropped."""
    while True:
        load = _loads(rng, experts, k)
        if dropped(load, capacity(sum(load) // k, experts, k, cf)) >= 0.03 * sum(load):
            return load


def _if(slip: bool, value: float, why: str) -> list[tuple[float, str]]:
    """The mistake (value, why) where the slip can happen with these numbers (k > 1)."""
    return [(value, why)] if slip else []


def _list(values) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


@problem("14.capacity", "An expert's capacity", unit="rows", kind="one step",
         formula="C = ⌈capacity_factor · N·k / E⌉ (N tokens, top-k of E experts)",
         source=f"{GSHARD}; notebook 14, 'Routing with a capacity'")
def expert_capacity(rng) -> Drawn:
    tokens = rng.randint(1000, 9000)
    experts = rng.choice([8, 16, 32, 64])
    k = rng.choice([1, 2, 4])
    cf = rng.choice([1.1, 1.25, 1.5])
    key = capacity(tokens, experts, k, cf)
    return Drawn(f"A group of N = {tokens} tokens is routed top-{k} to E = {experts} experts with capacity factor "
                 f"{cf:g}. How many rows may each expert take (its capacity C)?", key,
                 given={"N": tokens, "E": experts, "k": k, "cf": cf},
                 mistakes=[(capacity(tokens, experts, k, 1.0), "the capacity factor left out: it multiplies the even "
                            "share N·k/E"),
                           (capacity(tokens, experts, k, 1 / cf), "divided by the capacity factor: C exceeds the "
                            "even share")]
                 + _if(k > 1, capacity(tokens, experts, 1, cf), "k left out: each token makes k assignments, N·k rows "
                       "in all"))


@problem("14.dropped", "Assignments dropped over capacity", unit="assignments", kind="several steps",
         formula="C = ⌈cf · N·k / E⌉; dropped = Σ_i max(0, load_i − C)",
         source=f"{GSHARD}; notebook 14, 'Routing with a capacity'")
def dropped_assignments(rng) -> Drawn:
    experts = 8
    k = rng.choice([1, 2])
    cf = rng.choice([1.1, 1.25, 1.5])
    load = _over(rng, experts, k, cf)
    tokens = sum(load) // k
    cap = capacity(tokens, experts, k, cf)
    key = dropped(load, cap)
    return Drawn(f"A group of N = {tokens} tokens is routed top-{k} to {experts} experts, capacity factor {cf:g}; the "
                 f"experts receive {_list(load)} assignments. How many assignments are dropped?", key,
                 given={"load": load, "N": tokens, "E": experts, "k": k, "cf": cf},
                 mistakes=[(max(0, sum(load) - experts * cap), "the total over E·C: one expert's spare rows do not "
                            "take another's overflow"),
                           (dropped(load, capacity(tokens, experts, k, 1.0)), "the capacity factor left out of C")]
                 + _if(k > 1, dropped(load, capacity(tokens, experts, 1, cf)), "k left out of C: the budget covers "
                       "N·k assignments, not N"))


@problem("14.aux-loss", "The Switch load-balancing loss", unit="", kind="one step",
         formula="aux = α · E · Σ_i f_i · P_i (f_i: share of the tokens routed to expert i, P_i: its mean gate "
                 "probability)",
         source="Fedus et al. 2021 (Switch Transformer) §2.2, eq. 4; notebook 14, 'The load-balancing loss'")
def aux_loss(rng) -> Drawn:
    experts = 4
    load = _loads(rng, experts, 1)
    f = [c / sum(load) for c in load]
    thousandths = [round(1000 * (share + 1 / experts) / 2) for share in f]   # P leans the way f does
    thousandths[-1] = 1000 - sum(thousandths[:-1])
    gates = [t / 1000 for t in thousandths]
    alpha = rng.choice([0.01, 0.001, 0.05])
    key = switch_aux_loss(f, gates, alpha)
    return Drawn(f"A top-1 router sends {_list(load)} tokens to its {experts} experts; its mean gate probabilities "
                 f"are P = {_list(gates)}. What is the Switch auxiliary loss with α = {alpha:g}?", key,
                 given={"load": load, "P": gates, "alpha": alpha},
                 mistakes=[(key / experts, "the factor E left out: aux = α · E · Σ f_i · P_i"),
                           (switch_aux_loss(load, gates, alpha), "token counts for f: f_i is the share of the tokens"),
                           (switch_aux_loss(f, [1 / experts] * experts, alpha), "P taken as uniform: that gives α "
                            "whatever the loads")])


@problem("14.capped-imbalance", "The busiest expert's pace under a capacity", unit="×", kind="several steps",
         formula="C = ⌈cf · N·k / E⌉; kept_i = min(load_i, C); imbalance = max_i kept_i / mean_i kept_i",
         source=f"{GSHARD}; notebook 14, 'Imbalance: the busiest expert sets the pace'")
def capped_imbalance(rng) -> Drawn:
    experts = rng.choice([4, 8])
    k = rng.choice([1, 2])
    cf = rng.choice([1.1, 1.25, 1.5])
    load = _over(rng, experts, k, cf)
    tokens = sum(load) // k
    cap = capacity(tokens, experts, k, cf)
    kept = kept_rows(load, cap)
    key = imbalance(kept)
    return Drawn(f"Under expert parallelism each of {experts} ranks holds one expert; a group of N = {tokens} tokens "
                 f"routed top-{k} sends them {_list(load)} rows, capacity factor {cf:g}. How many times the mean "
                 "expert's rows does the busiest expert process (max/mean of the kept rows)?", key,
                 given={"load": load, "N": tokens, "E": experts, "k": k, "cf": cf},
                 mistakes=[(imbalance(load), "dropless: the capacity caps the busiest expert at C rows"),
                           (max(kept) * experts / sum(load), "the mean over the routed rows: the dropped ones are "
                            "never processed"),
                           *_if(k > 1, imbalance(kept_rows(load, capacity(tokens, experts, 1, cf))),
                                "k left out of C: the budget covers N·k rows")])


@problem("14.padded-vs-exact", "Exact-count against capacity-padded dispatch", unit="MB", kind="judgement",
         formula="padded: (n−1) · (E/n) · C · H · e; exact-count: Σ_{j≠r} rows_j · H · e; e = 2 B in bf16",
         source=f"{GSHARD}; notebook 14, 'Expert parallelism × data parallelism on 4 ranks'")
def padded_vs_exact(rng) -> Drawn:
    ranks = rng.choice([4, 8])
    experts = ranks * rng.choice([2, 4, 8])
    tokens = rng.choice([2048, 4096, 8192])
    k = rng.choice([c for c in (1, 2, 4, 8) if c <= experts // 4])
    cf = rng.choice([1.1, 1.25, 1.5, 2.0])
    hidden = rng.choice([2048, 4096, 7168])
    rank = rng.randrange(ranks)
    cap = capacity(tokens, experts, k, cf)
    even = tokens * k // ranks
    rows = [rng.randint(even // 2, min(experts // ranks * cap, even * 3 // 2)) for _ in range(ranks)]
    padded = padded_dispatch_bytes(ranks, experts, cap, hidden, 2)
    key = (padded - dispatch_bytes(rows, rank, hidden, 2)) / 1e6
    return Drawn(f"Rank {rank} of an expert-parallel group of {ranks} ranks ({experts} experts, {experts // ranks} "
                 f"per rank) routes N = {tokens} tokens top-{k}, capacity factor {cf:g}, hidden size {hidden}, bf16; "
                 f"after capacity it has {_list(rows)} rows for the experts of ranks 0–{ranks - 1}. How many MB less "
                 "does an exact-count dispatch send than a capacity-padded one (GShard's E·C slots; leave out the "
                 "counts' exchange)?", key,
                 given={"n": ranks, "E": experts, "N": tokens, "k": k, "cf": cf, "H": hidden, "rank": rank,
                        "rows": rows},
                 mistakes=[((padded - sum(rows) * hidden * 2) / 1e6, "the rank's own rows counted as sent: they "
                            "stay on the rank"),
                           ((padded * ranks // (ranks - 1) - dispatch_bytes(rows, rank, hidden, 2)) / 1e6,
                            "padded slots for all n ranks: the rank's own experts' slots are not sent"),
                           ((padded_dispatch_bytes(ranks, experts, capacity(tokens, experts, k, 1.0), hidden, 2)
                             - dispatch_bytes(rows, rank, hidden, 2)) / 1e6, "C without the capacity factor")])
