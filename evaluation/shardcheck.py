"""Sharded grants against an independent one-process run (docs/scale.md, "Shards").

`same_schedule` runs the workload twice, through the shards (batched, as the scale bench
runs them, or asked at every instant) and through the plain scoped `Scheduler`, and compares
what each run's simulator recorded for every action (arrival, start, end, units, node, cores):
nothing the router reports about itself is read.

`compare` runs a workload closed-loop twice with the same policy: once through
`ShardedScheduler` (the router's grants kept from its stream), once through the plain scoped
`Scheduler` in this process, which places every action itself (it is fed the workload's
arrivals, never the router's bindings). Decision by decision, it compares every grant (time,
action, units, node, cores or chunk) up to the first that differs: a wrong placement by the
router (a first action on another node than one scheduler picks) shows as a difference there.

    python -m evaluation.shardcheck coding 512 4          # WORKLOAD BATCH SHARDS
    python -m evaluation.shardcheck coding 512 4 first    # unbound until the first action
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from evaluation.baselines.common import NoLifecycle
from evaluation.closedloop import (
    ClosedLoopSimulator,
    EnvironmentStart,
    Lifecycle,
    LoopResult,
    Policy,
)
from evaluation.grant_recording import describe
from evaluation.workloads import get_workload
from evaluation.workloads.base import Workload
from solvers import get_allocator
from tangram.allocation import Assignment
from tangram.pools import CorePool, Pool
from tangram.runtime.shards import ShardedScheduler
from tangram.scheduler import Scheduler
from tangram.sharding import ShardLayout

Keyed = list[tuple[str, str, str]]


def _keyed(now: float, grants: Iterable[Assignment]) -> Keyed:
    return sorted(
        (r, a.placement[r].node, f"{now:.9g} {describe(a)}")
        for a in grants
        for r in sorted(a.units)
    )


def run_sharded(
    workload: Workload,
    policy: str,
    shards: int,
    lifecycle: Callable[[], Lifecycle] = EnvironmentStart,
    batched: bool = False,
) -> tuple[LoopResult, list[tuple[float, Keyed]]]:
    """The closed-loop run through the shards; the router's grants of every decision, as
    (time, grants), in order (one per call of the engine's, as the one-process run's)."""
    make = functools.partial(ShardedScheduler, shards=shards, log_stream=True, batched=batched)
    sim = ClosedLoopSimulator(workload, _policy(policy, make, lifecycle))
    try:
        result = sim.run()
    finally:
        sim.scheduler.close()
    stream = sim.scheduler.stream
    return result, [(ev[1], _keyed(ev[1], ev[2])) for ev in stream if ev[0] == "granted"]


@dataclass
class Comparison:
    """The router's grants against the one-process run's, decision by decision, up to the
    first decision where they differ (after it the runs differ)."""

    decisions: int = 0  # the one-process run's decisions compared
    grants: int = 0  # grants equal, up to the first difference
    first_difference: float | None = None  # its time
    stranded: bool = False  # there, the single scheduler left a shard idle with work waiting
    detail: str = ""


class _Differ(Exception):
    pass


class _Against(Scheduler):
    """The plain scoped `Scheduler`, checking each of its decisions against the router's grants
    as it makes them; it stops the run (`_Differ`) at the first difference."""

    def __init__(
        self,
        pools: Mapping[str, Pool],
        allocator,
        *,
        theirs: list[tuple[float, Keyed]],
        layout: ShardLayout,
        out: Comparison,
        **kw,
    ) -> None:
        super().__init__(pools, allocator, **kw)
        self._theirs, self._layout, self._out = theirs, layout, out

    def decide(self, now: float) -> list[Assignment]:
        got = super().decide(now)
        mine = _keyed(now, got)
        j = self._out.decisions
        at, theirs = self._theirs[j] if j < len(self._theirs) else (math.inf, [])
        if at != now or mine != theirs:  # a grant apart, or a decision at another time
            self.differ(min(at, now), mine, theirs if at == now else [])
        self._out.decisions += 1
        self._out.grants += len(mine)
        return got

    def differ(self, at: float, mine: Keyed, theirs: Keyed) -> None:
        self._out.first_difference = at
        self._out.stranded = _stranded(self, self._layout)
        self._out.detail = f"single {mine[:4]} sharded {theirs[:4]}"
        raise _Differ


def _stranded(sched: Scheduler, layout: ShardLayout) -> bool:
    """Whether `sched` leaves some shard's nodes with nothing running while actions bound
    there wait (its liveness rule is global: a shard's is per shard, so there the shard
    starts one and the single scheduler does not)."""
    busy = {
        layout.shard_of(ra.assignment.placement[r].node)
        for ra in sched.running.values()
        for r in ra.assignment.units
        if r in layout.resources
    }
    for a in sched.queue:
        for r in a.mins:
            node = sched.node_of(a, r)
            if r in layout.resources and node is not None and layout.shard_of(node) not in busy:
                return True
    return False


def _policy(policy: str, make: Callable, lifecycle: Callable[[], Lifecycle]) -> Policy:
    return Policy(policy, get_allocator(policy), lifecycle(), scoped=True, make_scheduler=make)


def compare(
    workload: Workload,
    policy: str,
    shards: int,
    lifecycle: Callable[[], Lifecycle] = EnvironmentStart,
    batched: bool = False,
) -> Comparison:
    """Run `workload` through the shards, then through one scheduler, and compare their grants
    (module docstring). `lifecycle`: `EnvironmentStart` binds each trajectory where its
    environment opens (as the runtime does); `NoLifecycle` leaves it unbound, so its first
    action's node is chosen by the router in one run and by the scheduler in the other. The
    state at a difference is the single scheduler's after its decision there (or its next
    one, where it made none at that time)."""
    _, theirs = run_sharded(workload, policy, shards, lifecycle, batched)
    pools = workload.make_pools()
    core = [r for r, p in pools.items() if isinstance(p, CorePool)]
    nodes = list(dict.fromkeys(n for r in core for n in pools[r].nodes()))
    out = Comparison()
    make = functools.partial(
        _Against, theirs=theirs, layout=ShardLayout.contiguous(core, nodes, shards), out=out
    )
    single = ClosedLoopSimulator(workload, _policy(policy, make, lifecycle))
    try:
        single.run()
    except _Differ:
        return out
    if out.decisions < len(theirs):  # the router decided after this run's last decision
        out.first_difference, more = theirs[out.decisions]
        out.detail = f"single [] sharded {more[:4]}"
    return out


def schedule(result: LoopResult) -> dict[str, tuple]:
    """What the simulator recorded of each action: arrival, start and end (to the ns), and
    per resource its units, node and cores (or chunk)."""
    return {
        aid: (
            round(r.arrival, 9),
            round(r.start, 9),
            round(r.end, 9),
            tuple(
                (res, r.units[res], p.node, tuple(p.cores or ()), p.chunk)
                for res, p in sorted(r.placement.items())
            ),
        )
        for aid, r in result.records.items()
    }


@dataclass
class ScheduleDiff:
    """Two independent runs' schedules: how many actions ran in both, how many the same, and
    the earliest-starting action that differs (None: none)."""

    actions: int
    equal: int
    first: tuple | None


def same_schedule(
    workload: Workload,
    policy: str,
    shards: int,
    lifecycle: Callable[[], Lifecycle] = EnvironmentStart,
    batched: bool = True,
) -> ScheduleDiff:
    """Run `workload` through the shards and, independently, through one scoped scheduler
    (each its own simulator, fed the same arrivals), and compare the schedules recorded."""
    sharded, _ = run_sharded(workload, policy, shards, lifecycle, batched)
    single = ClosedLoopSimulator(workload, _policy(policy, Scheduler, lifecycle)).run()
    a, b = schedule(sharded), schedule(single)
    differ = sorted(
        (min(a.get(k, (0, math.inf))[1], b.get(k, (0, math.inf))[1]), k, a.get(k), b.get(k))
        for k in a.keys() | b.keys()
        if a.get(k) != b.get(k)
    )
    return ScheduleDiff(
        len(a.keys() | b.keys()),
        len(a.keys() | b.keys()) - len(differ),
        differ[0] if differ else None,
    )


LIFECYCLES = {"open": EnvironmentStart, "first": NoLifecycle}

if __name__ == "__main__":
    name, batch, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    bind = sys.argv[4] if len(sys.argv) > 4 else "open"
    w = get_workload(name, batch=batch, nodes=max(1, batch // 128), cores_per_node=128)
    d = same_schedule(w, "heuristic", shards, LIFECYCLES[bind], batched=True)
    print(
        f"{name} batch {batch}, {shards} shards (batched), bound at {bind}: independent runs, "
        f"{d.equal:,} of {d.actions:,} actions scheduled the same; first difference: {d.first}"
    )
    c = compare(w, "heuristic", shards, LIFECYCLES[bind])
    print(
        f"{name} batch {batch}, {shards} shards, bound at {bind}: {c.decisions} decisions, "
        f"{c.grants} grants equal; first difference: {c.first_difference} (single scheduler "
        f"stranded a shard there: {c.stranded}) {c.detail}"
    )
