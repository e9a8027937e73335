"""Where FSDP's parameters go: the units, the unit that owns each parameter, and the attributes it is cut from.

    chosen = choose_units(model, units)                  # the unit modules, in the model's order
    shard_units(fsdp.units, model, mixed_precision)      # each unit's UnitShards; the attributes become slots

**Sharded**: every parameter goes to the one unit whose modules use it, or to the root (unit 0) when several do:
the root stays gathered through the whole forward, so a tied weight keeps one slot and gets one gradient. A
unit's parameters are grouped by (dtype, trainable, kept in its own dtype under mixed precision) into
`UnitShard`s, one `FlatShard` each. **Slots**: each parameter is deleted from `module._parameters[attr]`, so the
attribute holds a view of the gathered buffer while its unit computes, a `ShardedAttribute` otherwise
(fsdp_unit.py). `registered` puts tensors back as the module's parameters for a while, so nn.Module's own
state-dict code can name, order and load them (fsdp_state.py). Nothing here communicates.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn as nn

from partrain_edu.parallel.fsdp_unit import Unit, UnitShard
from partrain_edu.parallel.mixed_precision import MixedPrecision, full_precision_params


def choose_units(module: nn.Module, units) -> list[nn.Module]:
    """The unit modules in the wrapped module's order (the order prefetch assumes they run in): `units` is a list
    of submodules (or a ModuleList), a policy `callable(name, module) -> bool`, or None (the children of every
    ModuleList/ModuleDict: transformer blocks)."""
    named = [(name, m) for name, m in module.named_modules() if name]
    if isinstance(units, nn.Module):                        # a module is callable too: not a policy
        units = list(units.children()) if isinstance(units, (nn.ModuleList, nn.ModuleDict)) else [units]
    if units is None:
        children = {id(c) for _, m in named if isinstance(m, (nn.ModuleList, nn.ModuleDict)) for c in m.children()}
        return [m for _, m in named if id(m) in children]
    if callable(units):
        return [m for name, m in named if units(name, m)]
    wanted = {id(m) for m in units}
    chosen = [m for _, m in named if id(m) in wanted]
    if len(chosen) != len(wanted):
        raise ValueError("every unit must be a submodule of the wrapped module (not the module itself): pass "
                         "modules from module.modules(), or a policy callable(name, module) -> bool")
    return chosen


def _users_and_slots(module: nn.Module, units: list[Unit]):
    """Walk the module tree, each module under the innermost unit containing it: for every parameter (by id)
    the indices of the units using it, its slots [(module, attr, name)], and the parameter itself."""
    unit_of = {id(u.module): u for u in units}
    users: dict[int, set[int]] = {}                         # id(parameter) → indices of the units using it
    slots: dict[int, list] = {}                             # id(parameter) → [(module, attr, name)]
    params: dict[int, nn.Parameter] = {}
    seen: set[tuple[int, int]] = set()                      # (module, unit): a shared module is walked once each

    def walk(m: nn.Module, prefix: str, unit: Unit) -> None:
        unit = unit_of.get(id(m), unit)
        if (id(m), unit.index) in seen:
            return
        seen.add((id(m), unit.index))
        for attr, p in m._parameters.items():
            if p is not None:
                users.setdefault(id(p), set()).add(unit.index)
                params[id(p)] = p
                if all(s[0] is not m or s[1] != attr for s in slots.setdefault(id(p), [])):
                    slots[id(p)].append((m, attr, prefix + attr))
        for name, child in m._modules.items():
            if child is not None:
                walk(child, f"{prefix}{name}.", unit)

    walk(module, "", units[0])
    return users, slots, params


def shard_units(units: list[Unit], module: nn.Module, mixed_precision: MixedPrecision) -> None:
    """Give every parameter to its unit and lay each unit's parameters out in UnitShards by (dtype, trainable,
    kept in its dtype under mixed precision); the module attributes become plain slots, filled while their
    unit computes."""
    users, slots, params = _users_and_slots(module, units)
    kept = full_precision_params(module) if mixed_precision.param_dtype else set()   # BatchNorm's
    for u in units:
        mine = [i for i in params if users[i] == {u.index} or (u.index == 0 and len(users[i]) > 1)]
        groups: dict[tuple, list[int]] = {}
        for i in mine:
            groups.setdefault((params[i].dtype, params[i].requires_grad, i in kept), []).append(i)
        for (_, _, keep), ids in groups.items():
            for i in ids:
                for m, attr, _ in slots[i]:
                    del m._parameters[attr]                 # the attribute is the unit's to fill from now on
            u.shards.append(UnitShard(u, [params[i] for i in ids], [slots[i] for i in ids], keep_dtype=keep))


@contextlib.contextmanager
def registered(shards: list[UnitShard], fulls: dict[int, list[torch.Tensor]]):
    """The views in `fulls` (id(shard) → its parameters' views) registered as the module's parameters again,
    so nn.Module's own state-dict code names, orders and loads them (a tied parameter under each of its names,
    as in one process); the pieces are registered back afterwards."""
    for s in shards:
        s.register(fulls[id(s)])
    try:
        yield
    finally:
        for s in shards:
            s.register(s.flat.pieces)
