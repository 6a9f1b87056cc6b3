"""Batched node shards (`ShardedScheduler(batched=True)`, docs/scale.md "Batches"): the router
sends each shard many instants' work in one message, and the schedule is the one an
independent one-process run of the same arrivals makes. The comparison reads what each run's
simulator recorded for every action (arrival, start, end, units, node, cores), never the
router's own account of its grants."""

from __future__ import annotations

import functools
import os
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation.baselines.common import NoLifecycle
from evaluation.closedloop import ClosedLoopSimulator, EnvironmentStart, Policy
from evaluation.shardcheck import compare, same_schedule
from evaluation.workloads import get_workload
from solvers import get_allocator
from tangram.runtime.shards import ShardedScheduler


def _run(w, **kw):
    make = functools.partial(ShardedScheduler, **kw)
    sim = ClosedLoopSimulator(
        w, Policy("heuristic", get_allocator("heuristic"), scoped=True, make_scheduler=make)
    )
    try:
        return sim.run(), sim.scheduler
    finally:
        sim.scheduler.close()


@pytest.mark.parametrize("lifecycle", [EnvironmentStart, NoLifecycle])
def test_batched_shards_schedule_what_one_process_schedules(lifecycle):
    """Every action of the run starts at the same time with the same units, node and cores
    as in an independent one-process run, bound where environments open or unbound until the
    first action (the router places it in one run, the scheduler in the other)."""
    w = get_workload("coding", batch=40, nodes=4, cores_per_node=24, seed=2)
    d = same_schedule(w, "heuristic", 4, lifecycle, batched=True)
    assert d.first is None, d.first
    assert d.equal == d.actions == w.num_actions


def test_batched_shards_on_the_bench_cluster_and_with_pooled_resources():
    """Nodes of 128 cores (the scale bench's), and the mixed workload, whose GPU judge and
    APIs the global shard decides at once while the node shards answer later."""
    w = get_workload("coding", batch=256, nodes=2, cores_per_node=128, seed=3)
    d = same_schedule(w, "heuristic", 2, EnvironmentStart, batched=True)
    assert d.first is None and d.equal == w.num_actions, d.first
    m = get_workload("mixed", batch=64, nodes=2, cores_per_node=32, seed=4)
    d = same_schedule(m, "heuristic", 2, EnvironmentStart, batched=True)
    assert d.first is None and d.equal == m.num_actions, d.first


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(2, 4),
    cores_per_node=st.sampled_from([8, 16, 32]),
    per_node=st.integers(2, 12),
    shards=st.integers(2, 4),
    seed=st.integers(0, 10_000),
    lifecycle=st.sampled_from([EnvironmentStart, NoLifecycle]),
)
def test_batched_grants_equal_until_the_single_scheduler_strands_a_shard(
    nodes, cores_per_node, per_node, shards, seed, lifecycle
):
    """Contended clusters: decision by decision equal to the one-process run, up to where
    the single scheduler's global liveness rule leaves a shard idle with work bound there."""
    w = get_workload(
        "coding", batch=nodes * per_node, nodes=nodes, cores_per_node=cores_per_node, seed=seed
    )
    c = compare(w, "heuristic", min(shards, nodes), lifecycle, batched=True)
    assert c.first_difference is None or c.stranded, c.detail
    assert c.decisions > 0


def test_a_batch_carries_many_instants():
    """No message per instant: the batched run sends a small fraction of the messages the
    per-instant protocol sends, for the same decisions and the same schedule."""
    w = get_workload("coding", batch=256, nodes=2, cores_per_node=128, seed=5)
    every, s1 = _run(w, shards=2)
    batched, s2 = _run(w, shards=2, batched=True)
    assert s1.decisions == s2.decisions > 5000
    # 10,194 and 4,490 here: denser instants batch more (at 16,384: 12,000 for 173,000)
    assert s2.messages * 2 < s1.messages, (s2.messages, s1.messages)
    assert {k: (r.start, r.end) for k, r in every.records.items()} == {
        k: (r.start, r.end) for k, r in batched.records.items()
    }


def test_a_batched_run_survives_a_killed_shard():
    """A shard SIGKILLed mid-run: its replacement, built from the router's copies, decides
    the batch's last instant; every action still runs exactly once."""
    w = get_workload("coding", batch=32, nodes=4, cores_per_node=8, seed=7)
    make = functools.partial(ShardedScheduler, shards=2, batched=True)
    sim = ClosedLoopSimulator(
        w, Policy("coding", get_allocator("heuristic"), scoped=True, make_scheduler=make)
    )
    killed = []

    def kill_once(sched, _cpu):
        if sched.decisions >= 300 and not killed:
            killed.append(sched.shard_pids()[0])
            os.kill(killed[0], signal.SIGKILL)

    sim.on_decision = kill_once
    try:
        r = sim.run()
    finally:
        sim.scheduler.close()
    assert killed and sim.scheduler.restarts[0] == 1
    assert len(r.records) == w.num_actions
