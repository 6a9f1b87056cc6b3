"""The wire between the router and its shards: actions go out, grants come back.

What crosses on every message is numbers and strings, so neither side makes an object it does
not need (docs/scale.md, "What the messages cost"): a plain arrival as one flat tuple
(`to_wire`, `from_wire`), a grant of one resource as one flat tuple (`grant_to_wire`,
`grant_from_wire`), each rebuilt through the slots' own setters. Everything else is pickled with
the reducers below (for this pipe only: other pickling of these types is untouched), which send
what a value is made of and rebuild it without the dataclass machinery (`fields()` on every
object). Nothing is validated again that the router validated. An action's payload stays in
the router: a shard decides, it never runs anything."""

from __future__ import annotations

import copyreg
import dataclasses
import io
import operator
import pickle
from types import MappingProxyType
from typing import Any

import numpy as np

from tangram.actions import Action, Elasticity
from tangram.allocation import Assignment, RunningAction
from tangram.pools import Placement
from tangram.resources import Demand

TICK, BATCH, STATE, STOP = "tick", "batch", "state", "stop"  # the messages a shard answers

# every field of `Action` but those rebuilt here (so a new field crosses the pipe unasked)
_ACTION_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(Action)
    if f.name not in ("demands", "mins", "payload", "option_arrays")
)
assert _ACTION_FIELDS[0] == "id" and _ACTION_FIELDS[1] == "elasticity"  # `_reduce_action`
_values = operator.attrgetter(*_ACTION_FIELDS)


def _read_only(d: dict) -> MappingProxyType:
    return MappingProxyType(d)


def _action(demands: dict, mins: dict, values: tuple) -> Action:
    a = object.__new__(Action)
    put = object.__setattr__
    put(a, "demands", MappingProxyType(demands))
    put(a, "mins", MappingProxyType(mins))
    put(a, "payload", None)
    for name, v in zip(_ACTION_FIELDS, values):
        put(a, name, v)
    options = a.options
    put(
        a,
        "option_arrays",
        (
            np.array([m for m, _ in options], dtype=np.int64),
            np.array([d for _, d in options], dtype=np.float64),
        )
        if options
        else None,
    )
    return a


# an action that is not elastic and names one resource (nearly every tool call) crosses as the
# fields below in one flat tuple: everything else of it is derived (`from_wire`)
_PLAIN = ("id", "duration", "trajectory", "task", "kind", "service", "submit_time", "timeout")
assert set(_ACTION_FIELDS) == set(_PLAIN) | {"elasticity", "options"}, (
    "a new Action field: carry it in `_PLAIN` too"
)
_plain_values = operator.attrgetter(*_PLAIN)


def _demand(amounts: tuple[int, ...]) -> Demand:
    d = object.__new__(Demand)
    object.__setattr__(d, "amounts", amounts)
    return d


# the slots a plain action's fields are set through (a frozen class: its own `__setattr__`
# refuses), in the order of (resource, amounts, *_PLAIN) after the two derived from those
(
    _set_id,
    _set_duration,
    _set_trajectory,
    _set_task,
    _set_kind,
    _set_service,
    _set_submit,
    _set_to,
) = (getattr(Action, name).__set__ for name in _PLAIN)
(_set_demands, _set_mins, _set_payload, _set_elasticity, _set_options, _set_option_arrays) = (
    getattr(Action, name).__set__
    for name in ("demands", "mins", "payload", "elasticity", "options", "option_arrays")
)
# (resource, amounts) -> the read-only demands and mins of a plain action demanding them, one
# pair shared by every action that demands the same (both immutable); emptied when it holds
# `PROXIES_MAX` (the demands come from users: their variety is not bounded)
_PROXIES: dict[tuple[str, tuple[int, ...]], tuple[MappingProxyType, MappingProxyType]] = {}
PROXIES_MAX = 4096


def to_wire(a: Action) -> tuple | Action:
    """What the router puts in a shard's op stream for an arrival: a plain action (not
    elastic, one resource: nearly every tool call) as one flat tuple (resource, amounts,
    *its `_PLAIN` fields), pickled without a reducer; any other as itself. `from_wire` is
    the shard's side."""
    if a.elasticity is None and len(a.demands) == 1:
        for r, d in a.demands.items():
            return (r, d.amounts, *_plain_values(a))
    return a


def from_wire(t: tuple) -> Action:
    """The action `to_wire` flattened, rebuilt without validating again what the router
    validated."""
    key = (t[0], t[1])
    proxies = _PROXIES.get(key)
    if proxies is None:
        if len(_PROXIES) >= PROXIES_MAX:
            _PROXIES.clear()
        r, amounts = key
        proxies = _PROXIES[key] = (
            MappingProxyType({r: _demand(amounts)}),
            MappingProxyType({r: amounts[0]}),
        )
    a = object.__new__(Action)
    _set_demands(a, proxies[0])
    _set_mins(a, proxies[1])
    _set_payload(a, None)
    _set_elasticity(a, None)
    _set_options(a, ())
    _set_option_arrays(a, None)
    _set_id(a, t[2])
    _set_duration(a, t[3])
    _set_trajectory(a, t[4])
    _set_task(a, t[5])
    _set_kind(a, t[6])
    _set_service(a, t[7])
    _set_submit(a, t[8])
    _set_to(a, t[9])
    return a


_set_node, _set_cores, _set_chunk = (
    getattr(Placement, name).__set__ for name in ("node", "cores", "chunk")
)


def grant_to_wire(a: Assignment) -> tuple:
    """A shard's grant as the wire carries it: one of a single resource (nearly all) as one
    flat tuple (action id, resource, units, node, cores, chunk), any other as (action id,
    units, placement). `grant_from_wire` is the router's side."""
    units = a.units
    if len(units) == 1:
        for r, u in units.items():
            p = a.placement[r]
            return (a.action.id, r, u, p.node, p.cores, p.chunk)
    return (a.action.id, dict(units), dict(a.placement))


def grant_from_wire(g: tuple) -> tuple[str, dict, dict]:
    """(action id, units, placement) of a grant `grant_to_wire` sent."""
    if len(g) == 3:
        return g
    aid, r, u, node, cores, chunk = g
    p = object.__new__(Placement)
    _set_node(p, node)
    _set_cores(p, cores)
    _set_chunk(p, chunk)
    return aid, {r: u}, {r: p}


_set_action, _set_units, _set_placement = (
    getattr(Assignment, name).__set__ for name in ("action", "units", "placement")
)
_set_assignment, _set_start, _set_end = (
    getattr(RunningAction, name).__set__ for name in ("assignment", "start", "expected_end")
)


def assignment(action: Action, units: dict, placement: dict) -> Assignment:
    """`Assignment(action, units, placement)` for a grant a shard answered, built through its
    slots (the router makes one per grant)."""
    a = object.__new__(Assignment)
    _set_action(a, action)
    _set_units(a, units)
    _set_placement(a, placement)
    return a


def running_action(a: Assignment, start: float, expected_end: float) -> RunningAction:
    """`RunningAction(a, start, expected_end)`, built through its slots, as `assignment`."""
    ra = object.__new__(RunningAction)
    _set_assignment(ra, a)
    _set_start(ra, start)
    _set_end(ra, expected_end)
    return ra


def _reduce_action(a: Action):
    flat = to_wire(a)
    if type(flat) is tuple:  # a plain action: as in the op stream
        return from_wire, (flat,)
    el = a.elasticity
    values = _values(a)
    if el is not None and callable(el.efficiency):
        # E(m) as a function (a learned fit's closure) goes as its table over the allowed
        # amounts, the only ones a decision or a completion reads
        table = MappingProxyType({m: el.e(m) for m in a.demands[el.key].amounts})
        values = (values[0], _elasticity(el.key, el.t_ori, table)) + values[2:]
    return _action, (dict(a.demands), dict(a.mins), values)


def _elasticity(key: str, t_ori: float, efficiency) -> Elasticity:
    e = object.__new__(Elasticity)
    object.__setattr__(e, "key", key)
    object.__setattr__(e, "t_ori", t_ori)
    object.__setattr__(e, "efficiency", efficiency)
    return e


_WIRE = {
    **copyreg.dispatch_table,
    MappingProxyType: lambda m: (_read_only, (dict(m),)),
    Action: _reduce_action,
    Elasticity: lambda e: (_elasticity, (e.key, e.t_ori, e.efficiency)),
    Demand: lambda d: (Demand, (d.amounts,)),
    Placement: lambda p: (Placement, (p.node, p.cores, p.chunk)),
}


def wire_dumps(msg: Any) -> bytes:
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    p.dispatch_table = _WIRE
    p.dump(msg)
    return buf.getvalue()


def wire_loads(data: bytes) -> Any:
    return pickle.loads(data)
