"""Problems of chapter 07 (3D parallelism): the data-parallel shard a rank all-reduces, the model states per GPU,
the bubble at a global batch, what keeping TP on NVLink saves, and which rank order sends less across nodes.

Keys come from `theory.traffic` (step_traffic, link_time), `theory.memory.estimate_memory`,
`theory.schedules.bubble_formula` and `theory.network.members_per_node` (which groups leave a node), the functions
notebook 07 scales its measured 2 × 2 × 2 run up with.
"""
from __future__ import annotations

from partrain_edu.problems.core import Drawn, problem
from partrain_edu.theory.memory import estimate_memory
from partrain_edu.theory.network import members_per_node
from partrain_edu.theory.schedules import bubble_formula
from partrain_edu.theory.traffic import link_time, step_traffic

PTD_P = "Narayanan et al. 2021 §3"
# (name, Ψ, layers, hidden): GPT-3's shapes (Brown et al. 2020, Table 2.1; 13B at hidden 5120, as OPT-13B) and
# Megatron-LM's 39.1B (Narayanan et al. 2021, Table 1)
MODELS = [("1.3B", 1.3e9, 24, 2048), ("2.7B", 2.7e9, 32, 2560), ("6.7B", 6.7e9, 32, 4096),
          ("13B", 13e9, 40, 5120), ("39.1B", 39.1e9, 48, 8192), ("175B", 175e9, 96, 12288)]


def _layout(tp: int, pp: int, dp: int) -> str:
    return f"tp = {tp}, pp = {pp}, dp = {dp} ({tp * pp * dp} GPUs)"


@problem("07.dp-shard-bytes", "Bytes of the data-parallel all-reduce in a 3D layout", unit="GB", kind="one step",
         formula="sent = 2(d−1)/d · 2Ψ/(t·p): each rank all-reduces the gradients of its Ψ/(t·p) parameters",
         source=f"{PTD_P}; Rajbhandari et al. 2020 §7.1; notebook 07, 'What moves along each dimension'")
def dp_shard_bytes(rng) -> Drawn:
    name, params, _, _ = rng.choice(MODELS)
    tp = rng.choice([2, 4, 8])
    pp = rng.choice([2, 4, 8, 16])
    dp = rng.choice([2, 4, 8, 16, 32, 64])
    psi = int(params)
    key = step_traffic("ddp", psi, dp=dp, tp=tp, pp=pp).per_rank_bytes_sent / 1e9
    return Drawn(f"A {name}-parameter model trains with {_layout(tp, pp, dp)}, 16-bit gradients. How many GB does "
                 "one rank send in the data-parallel gradient all-reduce of one step (ring model)?", key,
                 given={"params": params, "tp": tp, "pp": pp, "dp": dp},
                 mistakes=[(step_traffic("ddp", psi, dp=dp).per_rank_bytes_sent / 1e9,
                            "the whole model's gradients: a rank holds Ψ/(tp·pp) parameters"),
                           (step_traffic("ddp", psi, dp=dp, tp=tp).per_rank_bytes_sent / 1e9,
                            "divided by tp only: each pipeline stage holds 1/pp of the layers too"),
                           (step_traffic("ddp", psi, dp=dp, tp=tp, pp=pp, bytes_per_element=4).per_rank_bytes_sent
                            / 1e9, "fp32 (4 bytes) for 16-bit gradients")])


@problem("07.model-states-3d", "Model states per GPU: 3D layout with ZeRO-1", unit="GB", kind="several steps",
         formula="Ψ' = Ψ/(t·p); 2Ψ' + 2Ψ' + 12Ψ'/d (mixed-precision Adam, optimizer states sharded over dp)",
         source=f"{PTD_P}; Rajbhandari et al. 2020 §5; notebook 07, 'Where each dimension belongs on a real "
                "cluster'")
def model_states_3d(rng) -> Drawn:
    name, params, _, _ = rng.choice(MODELS[2:])
    tp = rng.choice([2, 4, 8])
    pp = rng.choice([2, 4, 8, 16])
    dp = rng.choice([4, 8, 16, 32, 64])
    psi = int(params)

    def gb(**how) -> float:
        return estimate_memory(psi, **{"dp": dp, "tp": tp, "pp": pp, "zero": 1, **how}).total_bytes / 1e9

    key = gb()
    return Drawn(f"A {name}-parameter model trains with mixed-precision Adam on {_layout(tp, pp, dp)}, the "
                 "optimizer states sharded over the dp group (ZeRO-1). How many GB of model states (weights, "
                 "gradients, optimizer) does one GPU hold?", key,
                 given={"params": params, "tp": tp, "pp": pp, "dp": dp},
                 mistakes=[(gb(zero=0), "the optimizer states not sharded: ZeRO-1 splits them over dp"),
                           (gb(zero=3), "everything sharded over dp: ZeRO-1 shards the optimizer states only"),
                           (gb(pp=1), "pp forgotten: each stage holds 1/pp of the layers")])


@problem("07.bubble-at-a-batch", "The pipeline bubble at a given global batch", unit="%", kind="several steps",
         formula="m = B/(d·b) micro-batches per pipeline; bubble = (p−1)/(m+p−1)",
         source=f"{PTD_P}; Huang et al. 2019; notebook 07, 'Where each dimension belongs on a real cluster'")
def bubble_at_a_batch(rng) -> Drawn:
    pp = rng.choice([4, 8, 12, 16])
    dp = rng.choice([4, 8, 16, 32, 64])
    b = rng.choice([1, 2, 4])
    m = rng.choice([4, 8, 16, 24, 32, 48, 64, 96, 128])
    batch = m * dp * b

    def pct(microbatches: int) -> float:
        return float(bubble_formula("1f1b", pp, microbatches)[1]) * 100

    key = pct(m)
    slips = [(pct(batch // b), "dp forgotten: the global batch is shared by dp pipelines"),
             (pct(batch // dp), "the micro-batch size forgotten: m counts micro-batches of b sequences"),
             (key / 100, "a fraction, not a percentage")]
    return Drawn(f"A 3D layout has dp = {dp} pipelines of pp = {pp} stages (1F1B) and trains on a global batch of "
                 f"{batch} sequences per step, {b} per micro-batch. What share of the time is bubble, in %?", key,
                 given={"pp": pp, "dp": dp, "b": b, "batch": batch},
                 mistakes=slips)


@problem("07.tp-on-nvlink", "What keeping the tp group on NVLink saves", unit="s", kind="judgement",
         formula="bytes = 4·(L/p)·m · 2(t−1)/t · s·h·2; saved = bytes/β_IB − bytes/β_NVLink (bandwidth only)",
         source=f"{PTD_P}, Takeaway #1; notebook 07, 'Where each dimension belongs on a real cluster'")
def tp_on_nvlink(rng) -> Drawn:
    name, _, layers, h = rng.choice(MODELS[2:])
    tp = rng.choice([4, 8])
    pp = rng.choice([p for p in (2, 4, 8, 16) if layers % p == 0])
    dp = rng.choice([2, 4, 8, 16])
    m = rng.choice([8, 16, 32, 64])
    s = 2048

    def saved(**how) -> float:
        sent = step_traffic("tp", **{"tp": tp, "pp": pp, "layers": layers, "hidden": h, "seq": s, "micro_batch": 1,
                                     "microbatches": m, **how}).per_rank_bytes_sent
        return link_time(sent, "infiniband") - link_time(sent, "nvlink")

    key = saved()
    return Drawn(f"A {name} GPT ({layers} layers, hidden {h}) trains with {_layout(tp, pp, dp)}, {m} micro-batches "
                 f"of one {s}-token sequence per pipeline and step, 16-bit activations. Its tp group on NVLink 4 "
                 "(450 GB/s per GPU) or spread across nodes on InfiniBand NDR (50 GB/s): how many seconds per step "
                 "does NVLink save on one rank's TP all-reduces (bandwidth only)?", key,
                 given={"layers": layers, "h": h, "tp": tp, "pp": pp, "m": m, "s": s},
                 mistakes=[(saved(pp=1), "all the layers: a rank all-reduces only its stage's L/pp layers"),
                           (saved(microbatches=1), "one micro-batch: every one of the m micro-batches all-reduces"),
                           (key / 2, "forward only: f and g all-reduce twice more in backward")])


@problem("07.order-across-nodes", "Which rank order sends less across nodes", unit="×", kind="judgement",
         formula="pp outermost: pp's 2m·bsh·2 crosses; dp outermost: dp's 2(d−1)/d·2Ψ/(t·p) crosses; ratio dp/pp",
         source="Narayanan et al. 2021 §3 (Megatron-LM's order); picotron's (dp, pp, cp, tp) grid; notebook 07, "
                "'Two orders in use, and when each is preferable'")
def order_across_nodes(rng) -> Drawn:
    name, params, _, h = rng.choice(MODELS[:4])
    node = 8
    tp = rng.choice([1, 2, 4])
    pp = node // tp
    dp = node // tp
    s = rng.choice([2048, 4096])
    b = rng.choice([1, 2])
    m = rng.choice([4, 8, 16, 32])
    sizes = {"pp": pp, "dp": dp}
    sent = {"dp": step_traffic("ddp", int(params), dp=dp, tp=tp, pp=pp).per_rank_bytes_sent,
            "pp": step_traffic("pp", pp=pp, hidden=h, seq=s, micro_batch=b, microbatches=m).per_rank_bytes_sent}

    def across(strides: dict[str, int], shard=sent["dp"], boundary=sent["pp"]) -> int:
        """Bytes of the dimensions whose groups have fewer members on a node than in all (tp stays inside)."""
        mine = {"dp": shard, "pp": boundary}
        return sum(mine[d] for d, stride in strides.items() if members_per_node(sizes[d], stride, node) < sizes[d])

    megatron = {"dp": tp, "pp": tp * dp}         # (pp, dp, tp): a dp group is dp runs of tp ranks
    picotron = {"pp": tp, "dp": tp * pp}         # (dp, pp, tp): a pp group is pp runs of tp ranks
    key = across(picotron) / across(megatron)
    whole = step_traffic("ddp", int(params), dp=dp).per_rank_bytes_sent
    slips = [(1 / key, "the orders swapped: B is dp outermost, so its dp groups leave the node"),
             (across(picotron, shard=whole) / across(megatron), "dp's bytes for the whole model: a rank "
              "all-reduces the gradients of its Ψ/(tp·pp) parameters"),
             (across(picotron) / across(megatron, boundary=sent["pp"] // 2), "a middle stage's sends counted "
              "one way: its gradients go back as well")]
    return Drawn(f"On nodes of {node} GPUs, a {name} GPT (hidden {h}) trains with {_layout(tp, pp, dp)}, {m} "
                 f"micro-batches of {b} sequence{'s' * (b > 1)} of {s} tokens per pipeline and step, 16-bit "
                 "activations and gradients. Order A numbers rank (s, d, t) r = (s·dp + d)·tp + t (Megatron-LM), "
                 "order B r = (d·pp + s)·tp + t (picotron); how many times A's bytes does the busiest rank send "
                 "across nodes per step under B (below 1: B sends less)?", key,
                 given={"params": params, "h": h, "tp": tp, "pp": pp, "dp": dp, "s": s, "b": b, "m": m},
                 mistakes=[(value, why) for value, why in slips[: 3 if pp >= 3 else 2]])
