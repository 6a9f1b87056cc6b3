"""The receding-horizon exact policy, registered as `cpsat` and `pulp`.

At every decision it solves the exact schedule of what it can see (the first `window` queued
actions plus the running ones, pinned at their placements for their estimated remaining time)
and starts the actions that the optimal plan starts now. Future arrivals are unknown to it, so
it is optimal per decision, not for the whole instance (that is `solve_schedule`). Actions past
the window wait for a later decision, FCFS.

Pool usage that no running action explains (e.g. GPUs held by something else) is blocked for the
whole horizon. Core pools are scheduled as per-node unit counts; concrete cores are picked when
an action starts.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from solvers.exact.backend import NoSchedule, check_backend
from solvers.exact.model import (
    DEFAULT_RESOLUTION,
    Job,
    Mode,
    ScheduleModel,
    Slot,
    build_modes,
    flat_capacities,
    index_sets,
    template_pools,
    to_ticks,
)
from solvers.exact.schedule import realise, solve_model
from solvers.exact.timeline import EPS
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView, RunningAction, SlowPolicy, check_assignments
from tangram.pools import ChunkPool, CorePool, Pool


def _usage(pools: Mapping[str, Pool], running: Sequence[RunningAction]):
    """(flat units, GPUs) that the running actions hold, per (resource, node)."""
    flat: dict[tuple[str, str], int] = defaultdict(int)
    gpus: dict[tuple[str, str], set[int]] = defaultdict(set)
    for ra in running:
        for r, u in ra.assignment.units.items():
            p = ra.assignment.placement[r]
            if isinstance(pools[r], ChunkPool) and p.chunk is not None:
                gpus[(r, p.node)].update(range(*p.chunk))
            else:
                flat[(r, p.node)] += u
    return flat, gpus


def _pinned(ra: RunningAction, now: float, resolution: float) -> Job:
    a = ra.assignment
    remaining = max(ra.expected_end - now, resolution)
    slots = tuple(Slot(r, p.node, p.chunk) for r, p in a.placement.items())
    mode = Mode(dict(a.units), slots, remaining, max(1, to_ticks(remaining, resolution)))
    return Job(a.action, a.action.submit_time, 0, (mode,), pinned=True)


def view_model(
    view: ClusterView, queue: Sequence[Action], now: float, resolution: float
) -> ScheduleModel:
    """The schedule model of one decision: time 0 is `now`, the queue is released at 0."""
    pools, running = view.pools, list(view.running)
    ran_flat, ran_gpus = _usage(pools, running)
    cap = {(r, n): pools[r].free(n) + ran_flat[(r, n)] for r, n in flat_capacities(pools)}
    blocked: dict[str, dict[str, set[int]]] = {}
    for r, p in pools.items():
        if isinstance(p, ChunkPool):
            blocked[r] = {
                n: {g for c in p.tree(n).used for g in range(*c)} - ran_gpus[(r, n)]
                for n in p.nodes()
            }

    def duration(a: Action, units: int | None) -> float:
        return view.estimate(a, units)

    jobs = [_pinned(ra, now, resolution) for ra in running]
    for a in queue:
        bound = {r: n for r in a.demands if (n := view.node_for(a, r)) is not None}
        jobs.append(
            Job(
                a,
                a.submit_time,
                0,
                build_modes(a, pools, duration, resolution, blocked, bound, cap),
            )
        )
    flat, gpu = index_sets(jobs)
    return ScheduleModel(
        tuple(jobs), resolution, now, cap, flat, gpu, template_pools(pools, cap, blocked)
    )


def _concrete(pools: Mapping[str, Pool], starts: list[Assignment]) -> list[Assignment]:
    """Pick cores for core pools (the model counts units per node); others are already exact."""
    work = {r: p.copy() for r, p in pools.items() if isinstance(p, CorePool)}
    out = []
    for a in starts:
        placement = dict(a.placement)
        for r, pool in work.items():
            if r in placement:
                placement[r] = pool.place(a.units[r], node=placement[r].node)
        out.append(Assignment(a.action, a.units, placement))
    return out


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExactAllocator(SlowPolicy):
    """Receding-horizon exact policy (see the module docstring)."""

    backend: str = "cpsat"
    time_limit: float = 2.0
    resolution: float = DEFAULT_RESOLUTION
    window: int = 8
    workers: int | None = None

    def __post_init__(self) -> None:
        check_backend(self.backend)

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        visible = list(queue)[: self.window]
        if not visible:
            return []
        model = view_model(view, visible, now, self.resolution)
        try:
            raw = solve_model(model, self.backend, self.time_limit, self.workers)
        except NoSchedule as exc:
            # nothing found in time (a loaded machine): start nothing; the scheduler's
            # liveness and work-conservation rules start, FCFS, what fits
            log.warning("%s policy: %s; this decision falls back to FCFS", self.backend, exc)
            return []
        entries = realise(model, raw)
        starts = [
            e.assignment()
            for job, e in zip(model.jobs, entries)
            if not job.pinned and e.start <= now + EPS
        ]
        out = _concrete(view.pools, starts)
        check_assignments(view.pools, out, view.bindings)
        return out


@dataclass(frozen=True)
class CpSatAllocator(ExactAllocator):
    backend: str = "cpsat"


@dataclass(frozen=True)
class PulpAllocator(ExactAllocator):
    backend: str = "pulp-cbc"
