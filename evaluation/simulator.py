"""Open-loop replay of an instance file on the virtual clock: a driver of the one engine.

Actions arrive at their fixed submit times (the closed loop, `evaluation.closedloop`, submits a
trajectory's next action when its previous one completed instead); everything between an
action's arrival and its end is `evaluation.engine.Engine`'s, shared with the closed loop.
An instance file states its actions' durations, and the scheduler is handed them (the exact
solvers and the golden decisions compare policies on known durations); the closed loop's
scheduler learns them instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from evaluation.engine import Driver, Engine, SimExecutor, modelled_duration
from managers.gpu.sim import SimServiceModel
from tangram.actions import Action
from tangram.allocation import Allocator
from tangram.pools import Pool
from tangram.results import ScheduledAction
from tangram.scheduler import Scheduler

ARRIVAL = 1

__all__ = ["SimExecutor", "SimResult", "Simulator", "modelled_duration", "simulate"]


@dataclass(slots=True)
class SimResult:
    records: dict[str, ScheduledAction]
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


class Arrivals(Driver):
    """Admits every action arriving at an instant, then schedules the next arrival."""

    def __init__(self, actions: Sequence[Action]) -> None:
        self.actions = actions
        self.next = 0

    def begin(self, engine: Engine) -> None:
        if self.actions:
            engine.push(self.actions[0].submit_time, ARRIVAL)

    def handle(self, engine: Engine, kind: int, key: Any, now: float) -> None:
        acts, i = self.actions, self.next
        while i < len(acts) and acts[i].submit_time == now:
            engine.submit(acts[i])
            i += 1
        self.next = i
        if i < len(acts):
            engine.push(acts[i].submit_time, ARRIVAL)


class Simulator:
    def __init__(
        self,
        pools: Mapping[str, Pool],
        actions: Sequence[Action],
        allocator: Allocator,
        *,
        executors: Mapping[str, SimExecutor] | None = None,
        progress: Callable[[int], None] | None = None,
        bindings: Mapping[tuple[str, str], str] | None = None,
        scoped: bool = False,
    ) -> None:
        self.scheduler = Scheduler(pools, allocator, scoped=scoped)
        for (trajectory, resource), node in (bindings or {}).items():
            self.scheduler.bind(trajectory, resource, node)
        self.actions = sorted(actions, key=lambda a: a.submit_time)
        self.executors = dict(executors or {})
        self.progress = progress

    def run(self) -> SimResult:
        for act in self.actions:
            self.scheduler.validate(act)
        engine = Engine(self.scheduler, self.executors, progress=self.progress, timed=False)
        out = engine.run(Arrivals(self.actions))
        return SimResult(out.records, out.counters)


def simulate(
    instance, allocator: Allocator, progress=None, scoped: bool = False, conserve: bool = True
) -> SimResult:
    """Run an `tangram.instance.Instance` through `allocator`, modelling services if declared
    (each chunk pool with services gets its own residency model and placement advisor;
    `conserve=False`: without the scheduler's work-conservation rule, the policy alone)."""
    pools = instance.build_pools()
    executors: dict[str, SimExecutor] = {}
    for r, spec in instance.resources.items():
        if spec.services:
            model = SimServiceModel(spec)
            executors[r] = model
            pools[r].advisor = model.advisor
    sim = Simulator(
        pools,
        instance.actions,
        allocator,
        executors=executors,
        progress=progress,
        bindings=instance.bindings,
        scoped=scoped,
    )
    sim.scheduler.conserve &= conserve
    return sim.run()
