"""The exact schedule of a whole instance: the true optimum the heuristic is measured against.

Given arrivals, demands and durations, choose start times, amounts and placements (a concrete
aligned chunk for each GPU action) for every action, capacity respected at every moment,
minimising the total ACT `sum(end - arrival)`. `solve_schedule` builds the shared model
(`solvers.exact.model`), solves it with the injected backend and time limit, extracts the real
schedule, closes the rounding gaps (`timeline.left_shift`) and verifies it with the invariant
checker before returning it.

Not modelled: GPU service residency and restore times (the exact schedule assumes every service
resident, so with services it bounds the restore-free problem).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from solvers.exact.backend import RawSolution, SolveStatus, check_backend
from solvers.exact.cpsat_schedule import solve_cpsat
from solvers.exact.model import DEFAULT_RESOLUTION, ScheduleModel, instance_model
from solvers.exact.pulp_schedule import solve_pulp
from solvers.exact.timeline import extract, left_shift, verify
from tangram.instance import Instance
from tangram.results import ScheduledAction


@dataclass(frozen=True, slots=True)
class Schedule:
    """A verified schedule. `total_act` is in real seconds from the real durations; `bound` is
    the backend's proven lower bound on the discretised model's total ACT (None if unknown)."""

    status: SolveStatus
    entries: tuple[ScheduledAction, ...]
    total_act: float
    bound: float | None
    backend: str
    resolution: float
    solve_s: float

    def to_json(self) -> dict[str, Any]:
        """`tangram replay`'s JSON plus status, bound, backend, resolution and solve time."""
        return {
            "total_act": self.total_act,
            "actions": {
                e.action.id: {
                    "start": e.start,
                    "end": e.end,
                    "units": dict(e.units),
                    "placement": _placement_json(e),
                }
                for e in self.entries
            },
            "status": self.status,
            "bound": self.bound,
            "backend": self.backend,
            "resolution": self.resolution,
            "solve_s": self.solve_s,
        }


def _placement_json(e: ScheduledAction) -> dict[str, dict[str, Any]]:
    return {
        r: {"node": p.node, **({"chunk": list(p.chunk)} if p.chunk else {})}
        for r, p in e.placement.items()
    }


def solve_model(
    model: ScheduleModel, backend: str, time_limit: float, workers: int | None = None
) -> RawSolution:
    """Dispatch to the backend by name."""
    check_backend(backend)
    if backend == "cpsat":
        return solve_cpsat(model, time_limit, workers)
    return solve_pulp(model, backend, time_limit)


def realise(model: ScheduleModel, raw: RawSolution, compact: bool = True) -> list[ScheduledAction]:
    """Real-time entries of every job (pinned ones too), left-shifted and verified."""
    entries = extract(model, raw)
    if compact:
        entries = left_shift(model, entries)
    verify(model.template, entries, {j.action.id: j.arrival for j in model.jobs})
    return entries


def total_act(entries: Sequence[ScheduledAction]) -> float:
    return sum(e.end - e.action.submit_time for e in entries)


def solve_schedule(
    instance: Instance,
    backend: str = "cpsat",
    time_limit: float = 30.0,
    resolution: float = DEFAULT_RESOLUTION,
    workers: int | None = None,
    compact: bool = True,
) -> Schedule:
    """The exact (or, at the time limit, best found) schedule of `instance`.

    Raises `tangram.Infeasible` when no schedule exists and `TangramError` when the backend
    finds none in time. The result has passed `timeline.verify`.
    """
    model = instance_model(
        instance.build_pools(), instance.actions, resolution, bindings=instance.bindings
    )
    raw = solve_model(model, backend, time_limit, workers)
    entries = tuple(realise(model, raw, compact))
    arrivals = sum(j.arrival for j in model.jobs)
    bound = None if raw.bound is None else max(0.0, raw.bound * resolution - arrivals)
    return Schedule(raw.status, entries, total_act(entries), bound, backend, resolution, raw.wall_s)
