"""Work conservation: no action waits while what it could use is free.

The rule (docs/architecture.md section 6), checked after every decision. Walk the queue in
arrival order with the FCFS scan's blocking (`solvers/fcfs.py`): an action that does not start
blocks the pools it needs (one node of a per-node pool when it is bound there, else the whole
resource), and whatever waits behind a blocked action may wait too (strict FCFS, as documented).
An action *wastes* free units when nothing ahead of it on its pools is blocked and every amount
it allows (up to what a node of its pool can hold) fits the free units now (for an action not
bound to a node: on a node where nothing ahead of it is blocked): waiting cannot get it
more, so it should have started. An action on an idle pool always fits that way, so nothing
waits on an idle pool unless an action ahead of it waits for units of another pool; a put-off
elastic action whose largest amount is free is wasting, so it waits only for units that are not
free. Each wasting action is counted as if it had started at its fastest amount (on scratch
copies of the pools), so two actions are never both counted for the same free units.

`wasted_now` checks one instant: the scheduler enforces the rule with it after every decision
(`Scheduler(conserve=True)`), and the stateful tests call it. `check_schedule` replays a
finished schedule (arrivals, starts, ends, placements) through the same function and returns
every interval of waste and the idle unit-seconds while work waited: the simulator's results,
`tangram replay --check` and the experiments share it. A deferral (a pool's
`PlacementAdvisor.defer`: a GPU action waiting for a busy resident copy of its service rather
than restoring one) is a choice the schedule does not record; `check_schedule` counts it as
waste.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from tangram.actions import Action
from tangram.allocation import ClusterView, default_estimate
from tangram.errors import Infeasible
from tangram.pools import Placement, PlacementAdvisor, Pool
from tangram.queue import ActionQueue
from tangram.results import ScheduledAction

EPS = 1e-9
ALL = None  # blocked value: every node of the resource

NodeOf = Callable[[Action, str], "str | None"]
Estimate = Callable[[Action, "int | None"], float]


@dataclass(frozen=True, slots=True)
class Waste:
    """A queued action that could start now: the units it would start with (its fastest
    amount of the key resource, the minimum of every other) and where they are free."""

    action: Action
    units: Mapping[str, int]
    placement: Mapping[str, Placement]


def usable_amounts(action: Action, resource: str, pool: Pool, node: str | None) -> list[int]:
    """The amounts of `resource` the action allows that one node of the pool can hold (its
    bound node when given), ascending; the key resource of an elastic action may use any of
    them, every other resource is granted its minimum."""
    cap = pool.capacity(node) if node is not None else pool.largest_request()
    d = action.demands[resource]
    if resource != action.key:
        return [d.min]
    return [m for m in d.amounts if m <= cap] or [d.min]


def _start_amount(action: Action, amounts: list[int], estimate: Estimate) -> int:
    if len(amounts) == 1:
        return amounts[0]
    return min(amounts, key=lambda m: (estimate(action, m), m))


def wasted_now(
    pools: Mapping[str, Pool],
    queue: Iterable[Action],
    node_of: NodeOf,
    estimate: Estimate = default_estimate,
    excused: Callable[[Action, Mapping[str, Placement]], bool] | None = None,
    scope: Iterable[tuple[str, str | None]] | None = None,
    needed: Iterable[str] | None = None,
) -> list[Waste]:
    """The queued actions that waste free units now (module docstring), in queue order.

    `pools` are read, never changed. `excused(action, placement)`: True when the action may
    wait on those free units by choice (a deferral); it then blocks nothing. `scope`: with an
    `ActionQueue`, walk only these classes (a scoped decision's: the others did not change).
    `needed`: the resources the queued actions name, when the caller knows them (None: all)."""
    # a pool with nothing free cannot be wasted: skip the walk when every pool the queue needs
    # is full (only those: a decision's copy-on-read pools would copy every other one to ask)
    if not any(pools[r].free() for r in (pools if needed is None else needed)):
        return []
    w = _Walk(pools, node_of)
    walk = queue.scan(w.is_blocked, scope) if isinstance(queue, ActionQueue) else queue
    out: list[Waste] = []
    for a in walk:
        if w.waits_behind(a):
            w.block(a)
            continue
        units, placed = w.start(a, estimate)
        if len(units) == len(a.demands) and not (excused is not None and excused(a, placed)):
            out.append(Waste(a, units, placed))
            continue
        w.release(placed, units)
        if len(units) < len(a.demands):
            w.block(a)
    return out


class _Walk:
    """The state of one `wasted_now` walk: scratch copies of the pools (made on first use)
    and what is blocked so far (resource -> its blocked nodes, or ALL)."""

    __slots__ = ("pools", "node_of", "scratch", "blocked")

    def __init__(self, pools: Mapping[str, Pool], node_of: NodeOf) -> None:
        self.pools = pools
        self.node_of = node_of
        self.scratch: dict[str, Pool] = {}
        self.blocked: dict[str, set[str] | None] = {}

    def pool(self, r: str) -> Pool:
        p = self.scratch.get(r)
        if p is None:
            p = self.scratch[r] = self.pools[r].copy()
        return p

    def is_blocked(self, c: tuple[str, str | None]) -> bool:
        r, node = c
        if r not in self.blocked:
            return False
        b = self.blocked[r]
        return b is ALL or (node is not None and node in b)  # type: ignore[operator]

    def waits_behind(self, a: Action) -> bool:
        """Whether an action ahead of `a` is blocked on one of its pools."""
        return any(
            self.is_blocked((r, self.node_of(a, r) if self.pools[r].per_node else None))
            for r in a.demands
        )

    def block(self, a: Action) -> None:
        for r in a.demands:
            if self.blocked.get(r, 0) is ALL:
                continue
            node = self.node_of(a, r)
            nodes = self.blocked.setdefault(r, set())
            if node is not None and self.pools[r].per_node:
                nodes.add(node)  # type: ignore[union-attr]
            else:
                self.blocked[r] = ALL

    def start(self, a: Action, estimate: Estimate) -> tuple[dict[str, int], dict[str, Placement]]:
        """Start `a` on the scratch pools where every amount it allows is free, resource by
        resource, stopping at the first that is not: (units, placements) of those started."""
        units: dict[str, int] = {}
        placed: dict[str, Placement] = {}
        for r in a.demands:
            p = self.pool(r)
            node = self.node_of(a, r)
            amounts = usable_amounts(a, r, p, node)
            # an unbound action never takes a node on which an action ahead is blocked
            skip = self.blocked.get(r) or ()
            if p.fits(amounts[-1], node, skip) is None:  # not every amount it allows is free
                break
            k = _start_amount(a, amounts, estimate) if r == a.key else amounts[-1]
            like = _preference(self.pools[r].advisor, a)  # the pool's own advice, if any
            try:
                placed[r] = p.place(k, node, skip, like)
            except Infeasible:
                break
            units[r] = k
        return units, placed

    def release(self, placed: Mapping[str, Placement], units: Mapping[str, int]) -> None:
        for r, pl in placed.items():
            self.scratch[r].release(pl, units[r])


def _preference(adv: PlacementAdvisor | None, a: Action):
    return None if adv is None else (lambda node, chunk: adv.prefer(a, node, chunk))


def advisors_excuse(
    pools: Mapping[str, Pool], view: ClusterView, now: float
) -> Callable[[Action, Mapping[str, Placement]], bool] | None:
    """`wasted_now`'s `excused` from the pools' placement advisors: an action one of them
    defers on its placement (`PlacementAdvisor.defer`, `view` as the advisor reads it) waits by
    choice. None when no pool has an advisor."""
    advised = {r: p.advisor for r, p in pools.items() if p.advisor is not None}
    if not advised:
        return None

    def excused(a: Action, placed: Mapping[str, Placement]) -> bool:
        return any(r in advised and advised[r].defer(a, p, view, now) for r, p in placed.items())

    return excused


# -- a finished schedule -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class WasteInterval:
    """From `start` to `end`, `action` waited while `units` it could use were free."""

    action_id: str
    start: float
    end: float
    units: Mapping[str, int]

    @property
    def unit_seconds(self) -> float:
        return (self.end - self.start) * sum(self.units.values())


@dataclass(frozen=True, slots=True)
class ConservationReport:
    intervals: tuple[WasteInterval, ...]

    @property
    def idle_unit_seconds(self) -> float:
        """Idle unit-seconds while work waited: the sum over intervals of units x seconds."""
        return sum(w.unit_seconds for w in self.intervals)

    @property
    def actions(self) -> set[str]:
        return {w.action_id for w in self.intervals}

    def __bool__(self) -> bool:
        return bool(self.intervals)

    def to_json(self) -> dict:
        return {
            "idle_unit_seconds": self.idle_unit_seconds,
            "intervals": [
                {"action": w.action_id, "start": w.start, "end": w.end, "units": dict(w.units)}
                for w in self.intervals
            ],
        }


def check_schedule(
    pools: Mapping[str, Pool],
    schedule: Sequence[ScheduledAction],
    bindings: Mapping[tuple[str, str], str] | None = None,
    estimate: Estimate = default_estimate,
) -> ConservationReport:
    """Replay a finished schedule on `pools` (fresh, all free) and return every interval in
    which some action wasted free units (`wasted_now` at every instant something changed:
    ends first, then arrivals and starts, as the simulator orders them). The queue order is
    arrival order, ties in the schedule's order."""
    binds = dict(bindings or {})

    def node_of(a: Action, r: str) -> str | None:
        return None if a.trajectory is None else binds.get((a.trajectory, r))

    work = {r: p.copy() for r, p in pools.items()}
    order = sorted(range(len(schedule)), key=lambda i: (schedule[i].arrival, i))
    times = sorted({t for s in schedule for t in (s.arrival, s.start, s.end)})
    by_start = sorted(order, key=lambda i: schedule[i].start)
    by_end = sorted(order, key=lambda i: schedule[i].end)
    si = ei = ai = 0
    queued: dict[str, Action] = {}
    open_: dict[str, tuple[float, Mapping[str, int]]] = {}  # action -> (since, units)
    out: list[WasteInterval] = []
    for t in times:
        while ei < len(by_end) and schedule[by_end[ei]].end <= t + EPS:
            s = schedule[by_end[ei]]
            for r, u in s.units.items():
                work[r].release(s.placement[r], u)
            ei += 1
        while ai < len(order) and schedule[order[ai]].arrival <= t + EPS:
            a = schedule[order[ai]].action
            queued[a.id] = a
            ai += 1
        while si < len(by_start) and schedule[by_start[si]].start <= t + EPS:
            s = schedule[by_start[si]]
            queued.pop(s.action.id, None)
            for r, u in s.units.items():
                work[r].take(s.placement[r], u)
            si += 1
        now = {
            w.action.id: w.units for w in wasted_now(work, list(queued.values()), node_of, estimate)
        }
        for aid in list(open_):
            if aid not in now:
                since, units = open_.pop(aid)
                out.append(WasteInterval(aid, since, t, units))
        for aid, units in now.items():
            if aid not in open_:
                open_[aid] = (t, units)
    for aid, (since, units) in open_.items():  # cannot happen: every action starts
        out.append(WasteInterval(aid, since, since, units))
    out.sort(key=lambda w: (w.start, w.action_id))
    return ConservationReport(tuple(out))
