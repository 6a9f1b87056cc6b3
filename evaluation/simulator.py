"""A heap-based discrete-event simulator on a virtual clock.

It drives the real `tangram.scheduler.Scheduler` (and so the real policy and pool logic); only
time is virtual. Events are ordered by (time, priority, sequence): completions before arrivals
at the same instant, so freed units are visible to the decision. All events of one instant are
handled, then the policy is called once. Each action runs exactly its modelled duration, plus
whatever the per-resource executor model adds (GPU service restores).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from managers.gpu.sim import SimServiceModel
from tangram.actions import Action
from tangram.allocation import Allocator, Assignment
from tangram.errors import TangramError
from tangram.pools import Placement, Pool
from tangram.scheduler import Scheduler

COMPLETION, ARRIVAL = 0, 1


class SimExecutor(Protocol):
    """Models the time a manager adds around an action (e.g. a GPU service restore)."""

    def begin(self, assignment: Assignment, now: float) -> tuple[float, bool]: ...
    def end(self, assignment: Assignment, now: float) -> None: ...


@dataclass(frozen=True, slots=True)
class ActionRecord:
    arrival: float
    start: float
    end: float
    units: Mapping[str, int]
    restored: bool | None = None
    placement: Mapping[str, Placement] | None = None  # where it ran (`tangram.conservation`)


@dataclass(slots=True)
class SimResult:
    records: dict[str, ActionRecord]
    counters: dict[str, float] = field(default_factory=dict)

    @property
    def total_act(self) -> float:
        return sum(r.end - r.arrival for r in self.records.values())

    @property
    def makespan(self) -> float:
        return max((r.end for r in self.records.values()), default=0.0)

    def to_json(self) -> dict:
        actions = {}
        for aid, r in self.records.items():
            entry = {"start": r.start, "end": r.end, "units": dict(r.units)}
            if r.restored is not None:
                entry["restored"] = r.restored
            actions[aid] = entry
        return {"total_act": self.total_act, "actions": actions}


def modelled_duration(action: Action, units: Mapping[str, int]) -> float:
    el = action.elasticity
    if el is not None:
        return el.duration(units[el.key])
    if action.duration is None:
        raise TangramError(f"action {action.id}: the simulator needs a modelled duration")
    return action.duration


class Simulator:
    def __init__(self, pools: Mapping[str, Pool], actions: Sequence[Action],
                 allocator: Allocator, *, executors: Mapping[str, SimExecutor] | None = None,
                 prefer: Callable | None = None, defer: Callable | None = None,
                 progress: Callable[[int], None] | None = None,
                 bindings: Mapping[tuple[str, str], str] | None = None,
                 scoped: bool = False) -> None:
        self.scheduler = Scheduler(pools, allocator, prefer=prefer, defer=defer, scoped=scoped)
        for (trajectory, resource), node in (bindings or {}).items():
            self.scheduler.bind(trajectory, resource, node)
        self.actions = sorted(actions, key=lambda a: a.submit_time)
        self.executors = dict(executors or {})
        self.progress = progress
        self.counters: dict[str, float] = {"events": 0, "decisions": 0, "restores": 0}

    def run(self) -> SimResult:
        sched = self.scheduler
        records: dict[str, ActionRecord] = {}
        starts: dict[str, tuple[float, bool | None]] = {}
        events: list[tuple[float, int, int, str]] = []
        seq = 0
        nxt = 0
        acts = self.actions
        for act in acts:
            sched.validate(act)
        if acts:
            heapq.heappush(events, (acts[0].submit_time, ARRIVAL, seq, ""))
            seq += 1
        done = 0
        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, _, aid = heapq.heappop(events)
                self.counters["events"] += 1
                if kind == COMPLETION:
                    done_asg = sched.complete(aid, now, learn=False).assignment
                    for r in done_asg.units:
                        ex = self.executors.get(r)
                        if ex is not None:
                            ex.end(done_asg, now)
                    start, was_restored = starts.pop(aid)
                    records[aid] = ActionRecord(done_asg.action.submit_time, start, now,
                                                dict(done_asg.units), was_restored,
                                                dict(done_asg.placement))
                    done += 1
                else:
                    # admit every action arriving now, then schedule the next arrival
                    while nxt < len(acts) and acts[nxt].submit_time == now:
                        sched.enqueue(acts[nxt])
                        nxt += 1
                    if nxt < len(acts):
                        heapq.heappush(events, (acts[nxt].submit_time, ARRIVAL, seq, ""))
                        seq += 1
            for asg in sched.decide(now):
                dur = modelled_duration(asg.action, asg.units)
                restored: bool | None = None
                for r in asg.units:
                    ex = self.executors.get(r)
                    if ex is not None:
                        extra, restored = ex.begin(asg, now)
                        dur += extra
                        self.counters["restores"] += bool(restored)
                starts[asg.action.id] = (now, restored)
                heapq.heappush(events, (now + dur, COMPLETION, seq, asg.action.id))
                seq += 1
            if self.progress is not None:
                self.progress(done)
        self.counters["decisions"] = sched.decisions
        if sched.queue:
            raise TangramError(f"{len(sched.queue)} actions never started (first: "
                               f"{next(iter(sched.queue.keys()))})")
        return SimResult(records, self.counters)


def simulate(instance, allocator: Allocator, progress=None, scoped: bool = False,
             conserve: bool = True) -> SimResult:
    """Run an `tangram.instance.Instance` through `allocator`, modelling services if declared
    (`conserve=False`: without the scheduler's work-conservation rule, the policy alone)."""
    pools = instance.build_pools()
    executors: dict[str, SimExecutor] = {}
    prefer = defer = None
    for r, spec in instance.resources.items():
        if spec.services:
            model = SimServiceModel(spec)
            executors[r] = model
            prefer, defer = model.prefer, model.defer
    sim = Simulator(pools, instance.actions, allocator, executors=executors, prefer=prefer,
                    defer=defer, progress=progress, bindings=instance.bindings, scoped=scoped)
    sim.scheduler.conserve &= conserve
    return sim.run()
