"""`backfill`: the paper's heuristic plus conservative backfilling (beyond the paper).

Strict FCFS inside a pool (paper, Algorithm 1) leaves units idle behind a head action that does
not fit: a 5-core action waiting for a 2-core one holds back 1-core actions that would be done
before it could start. HPC schedulers recover that idle capacity by backfilling (Slurm; Mu'alem
and Feitelson 2001). A decision has two phases:

1. **The heuristic, unchanged** (`HeuristicAllocator.arrange`): FCFS candidates at minimum
   demands, greedy eviction, DPArrange.
2. **Conservative backfilling.** Walk the rest of the queue in order over a timeline per pool
   (`solvers.heuristic.timeline`): the units held by running actions and phase 1's starts until
   their estimated ends. Each action either *starts now*, when it fits in the pools now and, for
   its estimated duration, beside every reservation made so far; or gets a *reservation*, the
   earliest estimated time its units are free, taken in the timeline. An action greedy eviction
   sent back to wait is only reserved, never started here. A backfiller fits beside every
   reservation ahead of it, so it leaves each of their estimated starts where it was; an
   elastic backfiller gets the fastest amount that keeps that promise. A waiting elastic action
   reserves the amount it would finish soonest with.

`estimated_starts` recomputes the reservations of a decision from outside: it is the estimate
the promise is stated against (and what the tests check).

**When an estimate is wrong.** The promise holds for estimated durations. An action that runs
longer than estimated holds its units past the start reserved for an action behind it, and that
action starts late: a wrong estimate can *delay*. It cannot *starve*: a running action past its
estimate counts as ending now, so a waiting action's reservation never lies beyond the moment
every unit it needs could be free, and from then on a backfiller may only run beside it; the
action starts once the actions already holding its units end. An over-estimate only makes
backfilling more cautious.

**Order option** (`order="srpt"`): the queue is taken shortest estimated work first (units x
duration at the minimum amount) instead of in arrival order, with aging: an action that has
waited `aging` times its own shortest duration goes ahead of every action that has not, in
arrival order among themselves. So no action waits more than `aging` x its duration behind
later arrivals (plus the time the actions ahead of it need), and short actions stop queueing
behind long ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from solvers.fcfs import ScratchPools, deferred
from solvers.heuristic.objective import spread
from solvers.heuristic.policy import HeuristicAllocator
from solvers.heuristic.timeline import ChunkTimeline, CountTimeline, Slot, Timeline
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.conservation import advisors_excuse, wasted_now
from tangram.errors import ValidationError
from tangram.pools import ChunkPool, Placement, Pool
from topology import chunk_level


class Order(StrEnum):
    """The order in which `backfill` takes the queue (its `order` option)."""

    FCFS = "fcfs"  # arrival order, the paper's
    SRPT = "srpt"  # shortest estimated work first, with aging (see the module docstring)


RESERVE_OPTIONS = 3
"""Amounts a waiting elastic action's reservation tries (evenly spread, minimum and maximum
included): it reserves the one that finishes soonest."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A waiting action's estimated start, with the units (per resource) it was reserved for."""

    start: float
    units: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class BackfillDecision:
    """Everything one decision chose: all starts, which of them were backfilled (phase 2), and
    the reservations of the actions walked past (the estimate the promise is stated against)."""

    assignments: list[Assignment]
    backfilled: frozenset[str]
    reservations: dict[str, Reservation]


# -- timelines ---------------------------------------------------------------------------------
class _Timelines:
    """One timeline per resource, built on first use from what holds units now."""

    def __init__(self, view: ClusterView, held: list[tuple[Assignment, float]], now: float) -> None:
        self.view, self.held, self.now = view, held, now
        self._by_res: dict[str, Timeline] = {}

    def __getitem__(self, r: str) -> Timeline:
        tl = self._by_res.get(r)
        if tl is None:
            tl = self._by_res[r] = self._build(r)
        return tl

    def _build(self, r: str) -> Timeline:
        pool = self.view.pools[r]
        items = [(a.placement[r], a.units[r], end) for a, end in self.held if r in a.units]
        if isinstance(pool, ChunkPool):
            gpus = {n: pool.capacity(n) for n in pool.nodes()}
            return ChunkTimeline(
                self.now,
                gpus,
                [(p.node, p.chunk, end) for p, _, end in items if p.chunk is not None],
            )
        held_units: dict[str, int] = {}
        for p, u, _ in items:
            held_units[p.node] = held_units.get(p.node, 0) + u
        free = {n: pool.capacity(n) - held_units.get(n, 0) for n in pool.nodes()}
        return CountTimeline(self.now, free, [(p.node, end, u) for p, u, end in items])


def _held_now(view: ClusterView, started: list[Assignment], now: float):
    held = [(ra.assignment, max(ra.expected_end, now)) for ra in view.running]
    for a in started:
        k = a.action.key
        held.append((a, now + view.estimate(a.action, a.units[k] if k else None)))
    return held


def _choices(view: ClusterView, a: Action, fastest_first: bool, cap: int | None = None):
    """(units per resource, estimated duration) the action may run with: fastest first, or the
    reservation's `RESERVE_OPTIONS` evenly spread. `cap`: no more than that many units of the
    elastic resource (the others are left out before they are estimated)."""
    if a.is_elastic:
        key = a.key
        assert key is not None
        if not fastest_first:  # spread picks by position: only the picked are estimated
            opts = [(m, view.estimate(a, m)) for m, _ in spread(a.options, RESERVE_OPTIONS)]
        else:
            opts = [(m, view.estimate(a, m)) for m, _ in a.options if cap is None or m <= cap]
            opts.sort(key=lambda o: (o[1], o[0]))
        return [({**a.mins, key: m}, d) for m, d in opts]
    k = a.key
    return [(dict(a.mins), view.estimate(a, a.mins[k] if k else None))]


def _earliest(
    tls: _Timelines, view: ClusterView, a: Action, units: Mapping[str, int], d: float, now: float
) -> tuple[float, dict[str, Slot]] | None:
    """First estimated time every resource of `units` is free for d seconds (a fixed point over
    the resources: each one's earliest time at or after the others')."""
    t = now
    while True:
        slots: dict[str, Slot] = {}
        latest = t
        for r, k in units.items():
            got = tls[r].earliest(k, d, t, view.node_for(a, r))
            if got is None:
                return None
            slots[r] = got[1]
            latest = max(latest, got[0])
        if latest <= t + 1e-9:
            return t, slots
        if len(units) == 1:  # one resource: its own earliest time is the fixed point
            return latest, slots
        t = latest


def _reserve(tls: _Timelines, view: ClusterView, a: Action, now: float) -> Reservation | None:
    """Reserve the amount that finishes soonest (by the estimate) and take it in the timelines."""
    best = None
    for units, d in _choices(view, a, False):
        got = _earliest(tls, view, a, units, d, now)
        if got is not None and (best is None or got[0] + d < best[0] + best[1] - 1e-12):
            best = (got[0], d, units, got[1])
    if best is None:
        return None
    t, d, units, slots = best
    for r, k in units.items():
        tls[r].take(slots[r], k, t, t + d)
    return Reservation(t, units)


def _now_ok(pool: Pool, k: int) -> Callable[[Slot], bool]:
    """Whether a slot is free in the pool *now* (the timeline only knows estimates)."""

    def ok(slot: Slot) -> bool:
        node, chunk = slot
        if chunk is None:
            return pool.fits(k, node) is not None
        assert isinstance(pool, ChunkPool)
        size = 1 << chunk_level(k)
        return pool.tree(node).free_container((chunk[0], chunk[0] + size)) is not None

    return ok


def _try_start(
    tls: _Timelines, view: ClusterView, pools: ScratchPools, a: Action, now: float
) -> Assignment | None:
    """Start `a` now with its fastest amount that fits now and beside every reservation."""
    cap = pools[a.key].free() if a.is_elastic else None  # more can never fit now
    for units, d in _choices(view, a, True, cap):
        if any(pools[r].free() < k for r, k in units.items()):
            continue
        slots: dict[str, Slot] = {}
        for r, k in units.items():
            tl, now_ok = tls[r], _now_ok(pools[r], k)
            bound = view.node_for(a, r)
            for n in [bound] if bound is not None else tl.nodes():
                slot = tl.fits_now(k, d, n, now_ok)
                if slot is not None:
                    slots[r] = slot
                    break
            else:
                break
        if len(slots) < len(units):
            continue
        placement: dict[str, Placement] = {}
        for r, k in units.items():
            node, chunk = slots[r]
            if chunk is None:
                placement[r] = pools[r].place(k, node)
            else:
                placement[r] = Placement(node, chunk=chunk)
                pools[r].take(placement[r], k)
        if deferred(view, a, placement, now):
            for r, p in placement.items():
                pools[r].release(p, units[r])
            return None
        for r, k in units.items():
            tls[r].take(slots[r], k, now, now + d)
        return Assignment(a, units, placement)
    return None


def _walk(
    view: ClusterView,
    queue: Collection[Action],
    now: float,
    pools: ScratchPools,
    started: list[Assignment],
    wait: set[str],
    window: int,
    backfill: bool,
) -> tuple[list[Assignment], dict[str, Reservation]]:
    """Phase 2 over the actions not in `started`: start (if `backfill`) or reserve each."""
    tls = _Timelines(view, _held_now(view, started, now), now)
    done = {a.action.id for a in started}
    needed = view.queued_resources if view.queued_resources is not None else view.pools
    out: list[Assignment] = []
    reservations: dict[str, Reservation] = {}
    for a in queue:
        if len(reservations) >= window:
            break
        if a.id in done:
            continue
        if backfill and not any(pools[r].free() for r in needed):
            break  # nothing more can start now, so no further reservation matters
        if backfill and a.id not in wait:
            asg = _try_start(tls, view, pools, a, now)
            if asg is not None:
                out.append(asg)
                continue
        res = _reserve(tls, view, a, now)
        if res is not None:
            reservations[a.id] = res
    return out, reservations


def estimated_starts(
    view: ClusterView,
    queue: Collection[Action],
    now: float,
    started: list[Assignment],
    window: int = 64,
) -> dict[str, Reservation]:
    """The reservation of every waiting action when exactly `started` start now: the estimate
    backfilling promises never to make later for an action ahead of a backfiller."""
    pools = ScratchPools(view.pools)
    for a in started:
        for r, u in a.units.items():
            pools[r].take(a.placement[r], u)
    return _walk(view, queue, now, pools, started, set(), window, False)[1]


def _conserve(
    view: ClusterView,
    arrival: Collection[Action],
    now: float,
    pools: ScratchPools,
    started: list[Assignment],
) -> list[Assignment]:
    """Work conservation in arrival order (`tangram.conservation`): the SRPT order decides
    between actions that contend for units, never to leave an earlier arrival waiting beside
    free units it could use while nothing ahead of it is blocked. Those start now, at their
    fastest amount, on the decision's scratch pools."""
    done = {a.action.id for a in started}
    excused = advisors_excuse(view.pools, view, now)
    waiting = [a for a in arrival if a.id not in done]
    out = []
    needed = view.queued_resources
    for w in wasted_now(pools, waiting, view.node_for, view.estimate, excused, None, needed):
        for r, u in w.units.items():
            pools[r].take(w.placement[r], u)
        out.append(Assignment(w.action, dict(w.units), dict(w.placement)))
    return out


# -- ordering ----------------------------------------------------------------------------------
def srpt_order(
    view: ClusterView, queue: Collection[Action], now: float, aging: float
) -> list[Action]:
    """Shortest estimated work first; an action waiting over `aging` x its shortest duration
    goes ahead of all that are not (arrival order among those)."""
    aged, fresh = [], []
    estimate = view.estimate
    for i, a in enumerate(queue):
        k = a.key
        at_min = estimate(a, a.mins[k] if k else None)
        fastest = min(estimate(a, m) for m, _ in a.options) if a.is_elastic else at_min
        if now - a.submit_time >= aging * fastest:
            aged.append((a.submit_time, i, a))
        else:
            fresh.append((at_min * max(a.mins.values()), a.submit_time, i, a))
    aged.sort(key=lambda x: x[:2])
    fresh.sort(key=lambda x: x[:3])
    return [x[-1] for x in aged] + [x[-1] for x in fresh]


# -- the policy --------------------------------------------------------------------------------
@dataclass(frozen=True)
class BackfillAllocator(HeuristicAllocator):
    """The heuristic's options, plus:
    window: how many waiting actions get a reservation per decision (Slurm's bf_max_job_test;
    16 by default: a decision runs on every event, so it stays within ~1.5x the heuristic's
    time); actions past it wait for a later decision.
    order: "fcfs" (arrival order, the paper's) or "srpt" (shortest estimated work first).
    aging: with "srpt", the factor of its own duration after which an action goes first."""

    window: int = 16
    order: Order = Order.FCFS
    aging: float = 4.0

    def __post_init__(self) -> None:
        HeuristicAllocator.__post_init__(self)
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 0:
            raise ValidationError("allocator.window", self.window, "must be an integer >= 0")
        if self.order not in tuple(Order):  # the option as the user gave it, parsed once here
            raise ValidationError(
                "allocator.order", self.order, f"must be one of {', '.join(Order)}"
            )
        object.__setattr__(self, "order", Order(self.order))
        if (
            isinstance(self.aging, bool)
            or not isinstance(self.aging, (int, float))
            or not self.aging > 0
        ):
            raise ValidationError("allocator.aging", self.aging, "must be a positive number")

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        return self.decide(view, queue, now).assignments

    def decide(self, view: ClusterView, queue: Collection[Action], now: float) -> BackfillDecision:
        arrival = queue
        if self.order is Order.SRPT:
            queue = srpt_order(view, queue, now, self.aging)
        cands, evicted, pools = self.arrange(view, queue, now)
        started = [
            Assignment(c.action, c.units, c.placement)
            for i, c in enumerate(cands)
            if i not in evicted
        ]
        wait = {cands[i].action.id for i in evicted}
        if self.order is Order.SRPT:  # before backfilling: its reservations count these starts
            started += _conserve(view, arrival, now, pools, started)
        if self.window == 0:
            return BackfillDecision(started, frozenset(), {})
        more, reservations = _walk(view, queue, now, pools, started, wait, self.window, True)
        return BackfillDecision(started + more, frozenset(a.action.id for a in more), reservations)


@dataclass(frozen=True)
class BackfillSrptAllocator(BackfillAllocator):
    """`backfill` with the order option on: shortest estimated work first, with aging."""

    order: Order = Order.SRPT
