"""First-come-first-served service calls over one chunk pool, on the one engine.

Shared by the hand-worked scenario tests and the benchmark's bursty trace: actions (each one
service call of a fixed DoP) start in arrival order as soon as a chunk is free (the `min`
policy, the scheduler's FCFS scan), placed by `ChunkPool.place` with or without the residency
preference (the pool's advisor; never waiting for a busy copy); each runs `restore_s +
infer_s`. It runs on `evaluation.engine` like every simulation, so restores can be counted
under different placement and eviction policies with the scheduler's own rules.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from evaluation.engine import Engine
from evaluation.simulator import Arrivals
from managers.gpu.advisor import ResidencyAdvisor
from managers.gpu.residency import Residency, RestoreDecision
from solvers import get_allocator
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.pools import ChunkPool, Placement
from tangram.results import ScheduledAction
from tangram.scheduler import Scheduler

__all__ = ["chunk_of", "k_of", "serve"]


class _PreferOnly(ResidencyAdvisor):
    """The residency preference without waiting: the trace starts whatever fits."""

    def defer(self, action, placement, view, now) -> bool:
        return False


class _Restores:
    """The time model: each call restores its service first where it is not resident."""

    def __init__(self, residency: Residency, resource: str) -> None:
        self.residency = residency
        self.resource = resource
        self.decisions: dict[str, RestoreDecision] = {}

    def begin(self, a: Assignment, now: float) -> tuple[float, bool]:
        where = a.placement[self.resource]
        d = self.residency.begin(a.action, where.node, chunk_of(where), now)
        self.decisions[a.action.id] = d
        return d.restore_s, d.restored

    def end(self, a: Assignment, now: float) -> None:
        where = a.placement[self.resource]
        self.residency.end(a.action, where.node, chunk_of(where), now)


def serve(
    actions: Iterable[Action],
    pool: ChunkPool,
    residency: Residency,
    prefer: bool = True,
    default_infer_s: float = 1.0,
) -> list[ScheduledAction]:
    """Run every action (a GPU demand of one amount on `pool.resource`, a `service`) FCFS.

    An action's duration is its own `duration`, else its service's profiled inference time,
    else `default_infer_s`. Returns one record per action, in start order, each with whether
    it restored its service and the services that restore evicted (`ScheduledAction.evicted`).
    """
    res = pool.resource
    timed = []
    for a in sorted(actions, key=lambda a: a.submit_time):
        service = residency.registry.get(a.service)
        timed.append(
            a
            if a.duration
            else dataclasses.replace(
                a, duration=service.infer_seconds(k_of(a, res), default_infer_s)
            )
        )
    pool.advisor = _PreferOnly(residency) if prefer else None
    model = _Restores(residency, res)
    sched = Scheduler({res: pool}, get_allocator("min"))
    out = Engine(sched, {res: model}, timed=False).run(Arrivals(timed)).records
    served = []
    for a in timed:
        evicted = tuple(e.service for e in model.decisions[a.id].evicted)
        served.append(dataclasses.replace(out[a.id], evicted=evicted))
    served.sort(key=lambda s: s.start)  # stable: equal starts keep arrival order
    return served


def k_of(action: Action, resource: str) -> int:
    return action.demands[resource].min


def chunk_of(placement: Placement) -> tuple[int, int]:
    if placement.chunk is None:
        raise ValueError(f"placement on {placement.node} has no chunk")
    return placement.chunk
