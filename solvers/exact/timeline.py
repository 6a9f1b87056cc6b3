"""Schedules in real time (`tangram.results.ScheduledAction`s): extraction from a backend's
answer, left shift, and verification.

Verification replays a schedule through the one invariant checker: at every start time, every
placement running then is taken into fresh copies of the pools (`check_assignments`). Intervals
are half-open, `[start, end)`, with a tolerance `EPS` for float noise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from solvers.exact.backend import RawSolution
from solvers.exact.model import ScheduleModel
from tangram.allocation import check_assignments
from tangram.errors import InvariantError
from tangram.pools import Pool
from tangram.results import ScheduledAction

EPS = 1e-9


def running_at(e: ScheduledAction, t: float) -> bool:
    """Whether `e` runs at time `t`: its interval `[start, end)` holds `t`, within `EPS`."""
    return e.start <= t + EPS and e.end - t > EPS


def extract(model: ScheduleModel, raw: RawSolution) -> list[ScheduledAction]:
    """Real-time entries (pinned jobs included) from chosen modes and start ticks."""
    out = []
    for job, m, tick in zip(model.jobs, raw.modes, raw.starts):
        mode = job.modes[m]
        start = model.origin + tick * model.resolution
        out.append(
            ScheduledAction(
                job.action,
                job.arrival,
                start,
                start + mode.duration,
                dict(mode.units),
                {s.resource: s.placement() for s in mode.slots},
            )
        )
    return out


def fits(
    pools: Mapping[str, Pool], placed: Sequence[ScheduledAction], new: ScheduledAction
) -> bool:
    """Whether `new` can run alongside `placed` at every moment of its interval."""
    times = [new.start] + [p.start for p in placed if new.start < p.start < new.end - EPS]
    for t in times:
        running = [p.assignment() for p in placed if running_at(p, t)]
        try:
            check_assignments(pools, running + [new.assignment()])
        except InvariantError:
            return False
    return True


def left_shift(model: ScheduleModel, entries: Sequence[ScheduledAction]) -> list[ScheduledAction]:
    """Start each action, in start order, at the earliest real time its placement is free.

    Rounding durations up to ticks leaves gaps; closing them keeps every placement and never
    delays anything: an action only moves earlier, and only past actions already placed, so
    after its old start every moment holds a subset of what the solver's schedule held.
    """
    order = sorted(range(len(entries)), key=lambda k: (entries[k].start, k))
    placed = [entries[k] for k in order if model.jobs[k].pinned]
    out: list[ScheduledAction] = list(entries)
    for k in order:
        job, e = model.jobs[k], entries[k]
        if job.pinned:
            continue
        lo = max(job.arrival, model.origin)
        times = sorted({lo} | {p.end for p in placed if lo < p.end < e.start - EPS})
        for t in times:
            if t >= e.start - EPS:
                break
            moved = replace(e, start=t, end=t + (e.end - e.start))
            if fits(model.template, placed, moved):
                e = moved
                break
        out[k] = e
        placed.append(e)
    return out


def verify(
    pools: Mapping[str, Pool],
    entries: Sequence[ScheduledAction],
    arrivals: Mapping[str, float] | None = None,
) -> None:
    """Raise `InvariantError` unless every moment of the schedule passes `check_assignments`
    (and, given `arrivals`, no action starts before it arrives)."""
    for e in entries:
        if e.end <= e.start:
            raise InvariantError(f"action {e.action.id}: ends at {e.end} before start {e.start}")
        if arrivals is not None and e.start < arrivals[e.action.id] - EPS:
            raise InvariantError(
                f"action {e.action.id}: starts at {e.start} before it arrives "
                f"at {arrivals[e.action.id]}"
            )
    for t in sorted({e.start for e in entries}):
        running = [e.assignment() for e in entries if running_at(e, t)]
        try:
            check_assignments(pools, running)
        except InvariantError as exc:
            raise InvariantError(f"schedule at t={t:g}: {exc}") from exc
