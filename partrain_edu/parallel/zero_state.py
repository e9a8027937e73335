"""ZeroOptimizer's state dict in one process's format: the sharded states gathered to save, cut again to load.

    sd = opt.state_dict()          # every rank calls it (collectives); any rank may save it
    opt.load_state_dict(sd)        # local: each rank keeps its chunk; a plain optimizer's dict loads too

**Sharded**: rank k's inner optimizer holds the states of its pieces only (chunk k of each `FlatShard`).
**Sent** by `state_dict`, per FlatShard: one all-gather per per-element state (AdamW's exp_avg and exp_avg_sq:
(n−1)/n·Ψ·4 bytes each, fp32), and one `all_gather_object` of which pieces hold a state, with their scalars
(`step`): a parameter is split over ranks, and a rank whose pieces never got a gradient holds no state at all.
`load_state_dict` sends nothing: each rank cuts its piece out of every full per-element state.
Param groups: `{"state": {i: …}, "param_groups": [{…, "params": [i, …]}]}`, parameters numbered across groups
in order; hyperparameters (lr, betas, …) go between the outer groups and the inner optimizer's through
`mirror_hyperparameters`, in one place.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def mirror_hyperparameters(source: list[dict], target: list[dict], missing_only: bool = False) -> None:
    """Copy every key but "params" of each param group in `source` into the same group of `target` (only the
    keys `target` lacks, when `missing_only`): the outer groups an LR scheduler writes, the inner ones that step."""
    for src, dst in zip(source, target, strict=True):
        for key, value in src.items():
            if key != "params" and not (missing_only and key in dst):
                dst[key] = value


def _per_element(value) -> bool:
    """A state shaped like its piece (a moment, a momentum buffer), as opposed to a scalar such as `step`."""
    return isinstance(value, torch.Tensor) and value.dim() > 0


def _numbering(param_groups: list[dict]) -> dict[int, int]:
    """id(parameter) → its index across all groups: the keys of a single-process state dict."""
    return {id(p): i for i, p in enumerate(p for g in param_groups for p in g["params"])}


def full_state_dict(opt) -> dict:
    """The single-process optimizer's state dict of ZeroOptimizer `opt` (full states). A collective."""
    index = _numbering(opt.param_groups)
    state = {}
    for flat in opt.flats:
        pieces = [opt.inner.state.get(piece, {}) for piece in flat.pieces]
        # Ranks may hold different keys (a rank whose pieces never had a gradient holds none): agree first.
        mine = ([bool(st) for st in pieces],                                   # which pieces hold a state
                {k for st in pieces for k, v in st.items() if _per_element(v)},  # the per-element keys
                [{k: v for k, v in st.items() if not _per_element(v)} for st in pieces])   # the scalars
        everyone = [None] * dist.get_world_size(opt.group)
        dist.all_gather_object(everyone, mine, group=opt.group)
        stepped, keys, scalars = zip(*everyone, strict=True)                                # each: one entry per rank
        full = {k: flat.gather_state([st.get(k) for st in pieces]) for k in sorted(set().union(*keys))}
        for i, p in enumerate(flat.params):
            holder = next((r for r, held in enumerate(stepped) if held[i]), None)
            if holder is None:
                continue                                    # never stepped: absent, as in one process
            a, b, shape = flat.spans[i]
            state[index[id(p)]] = {**scalars[holder][i], **{k: v[a:b].view(shape).clone() for k, v in full.items()}}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[id(p)] for p in g["params"]]}
              for g in opt.param_groups]
    return {"state": state, "param_groups": groups}


def load_full_state_dict(opt, state_dict: dict) -> None:
    """Load a single-process state dict into ZeroOptimizer `opt`: keep this rank's pieces. Local."""
    params = [p for g in opt.param_groups for p in g["params"]]
    if len(state_dict["param_groups"]) != len(opt.param_groups):
        raise ValueError(f"state dict has {len(state_dict['param_groups'])} param groups, this optimizer "
                         f"{len(opt.param_groups)}: load it into an optimizer built the same way")
    mirror_hyperparameters(state_dict["param_groups"], opt.param_groups)   # the inner ones follow at step()
    opt.inner.state.clear()
    for i, st in state_dict["state"].items():
        p = params[int(i)]
        if id(p) not in opt.where:
            continue                                        # frozen: ZeroOptimizer holds no piece of it
        flat, j = opt.where[id(p)]
        opt.inner.state[flat.pieces[j]] = {
            k: flat.piece_of(j, v).clone() if _per_element(v) and v.shape == p.shape
            else (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in st.items()}
