"""Sharded grants against the single scheduler's, on the same stream (docs/scale.md, "Shards").

`run_sharded` runs a workload closed-loop through `ShardedScheduler` and keeps the stream the
router saw (bindings, arrivals as routed, completions, decisions, grants); `compare_stream`
feeds that stream to one scoped `Scheduler` in this process and compares every decision's
grants (time, action, units, node, cores or chunk).

    python -m evaluation.shardcheck coding 512 4     # WORKLOAD BATCH SHARDS
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from evaluation.closedloop import ClosedLoopSimulator, LoopResult, Policy
from evaluation.decisions import describe
from evaluation.workloads import get_workload
from evaluation.workloads.base import Workload
from solvers import get_allocator
from tangram.allocation import Assignment
from tangram.pools import CorePool, Pool
from tangram.runtime.shards import ShardedScheduler
from tangram.scheduler import Scheduler
from tangram.sharding import ShardLayout


def run_sharded(workload: Workload, policy: str, shards: int) -> tuple[LoopResult, list[tuple]]:
    make = functools.partial(ShardedScheduler, shards=shards, log_stream=True)
    sim = ClosedLoopSimulator(
        workload, Policy(policy, get_allocator(policy), scoped=True, make_scheduler=make)
    )
    try:
        result = sim.run()
    finally:
        sim.scheduler.close()
    return result, sim.scheduler.stream


def _keyed(now: float, grants: Iterable[Assignment]) -> list[tuple[str, str, str]]:
    return sorted(
        (r, a.placement[r].node, f"{now:.9g} {describe(a)}")
        for a in grants
        for r in sorted(a.units)
    )


@dataclass
class Comparison:
    """The router's grants against the single scoped scheduler's on the same stream, decision
    by decision, up to the first decision where they differ (after it the states differ)."""

    decisions: int = 0  # decisions compared (all of them when `first_difference` is None)
    grants: int = 0  # grants equal, up to the first difference
    first_difference: float | None = None  # its time
    stranded: bool = False  # there, the single scheduler left a shard idle with work waiting
    detail: str = ""


def compare_stream(
    stream: list[tuple], pools: Mapping[str, Pool], policy: str, layout: ShardLayout
) -> Comparison:
    """Feed the router's stream to one scoped `Scheduler` and compare every decision's grants.
    Where they first differ, say whether the single scheduler had left some shard's nodes with
    nothing running while actions bound there waited (its liveness rule is global: a shard's
    is per shard, so there the shard starts one and the single scheduler does not)."""
    sched = Scheduler(pools, get_allocator(policy), scoped=True)
    calls: dict[str, Callable] = {
        "bind": sched.bind,
        "unbind": sched.unbind,
        "enqueue": sched.enqueue,
        "cancel": sched.cancel,
        "complete": sched.complete,
    }
    out = Comparison()
    mine: list[tuple[str, str, str]] = []
    for ev in stream:
        op = ev[0]
        if op == "decide":
            mine = _keyed(ev[1], sched.decide(ev[1]))
        elif op == "granted":
            theirs = _keyed(ev[1], ev[2])
            if mine != theirs:
                out.first_difference = ev[1]
                out.stranded = _stranded(sched, layout)
                out.detail = f"single {mine[:4]} sharded {theirs[:4]}"
                return out
            out.decisions += 1
            out.grants += len(mine)
        else:
            calls[op](*ev[1:])
    return out


def _stranded(sched: Scheduler, layout: ShardLayout) -> bool:
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


def compare(workload: Workload, policy: str, shards: int) -> Comparison:
    _, stream = run_sharded(workload, policy, shards)
    pools = workload.make_pools()
    core = [r for r, p in pools.items() if isinstance(p, CorePool)]
    nodes = list(dict.fromkeys(n for r in core for n in pools[r].nodes()))
    return compare_stream(stream, pools, policy, ShardLayout.contiguous(core, nodes, shards))


if __name__ == "__main__":
    name, batch, shards = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    w = get_workload(name, batch=batch, nodes=max(1, batch // 128), cores_per_node=128)
    c = compare(w, "heuristic", shards)
    print(
        f"{name} batch {batch}, {shards} shards: {c.decisions} decisions, {c.grants} grants "
        f"equal; first difference: {c.first_difference} (single scheduler stranded a shard "
        f"there: {c.stranded}) {c.detail}"
    )
