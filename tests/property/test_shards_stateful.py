"""Stateful liveness of the sharded scheduler (`tangram.runtime.shards`): the machine of
tests/property/test_liveness_stateful.py (random arrivals, completions, cancels, bindings; the
wait bound; every unit back at the end) drives `ShardedScheduler` with one shard process per
node, and after every step, per shard: no shard process runs nothing while actions wait in it
(liveness per shard, stronger than the single scheduler's rule for the whole cluster), and work
conservation per shard (`no_waste`)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant
from test_liveness_stateful import POLICIES, REORDERS, SchedulerMachine

from solvers import get_allocator
from tangram.conservation import wasted_now
from tangram.pools import CorePool
from tangram.runtime.shards import ShardedScheduler
from topology import CpuNode


class ShardedMachine(SchedulerMachine):
    @initialize(
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=3),
        policy=st.sampled_from(POLICIES),
        scoped=st.just(True),
    )
    def setup(self, sizes: list[int], policy: str, scoped: bool) -> None:
        nodes = {f"n{i}": CpuNode(f"n{i}", {0: tuple(range(c))}) for i, c in enumerate(sizes)}
        self.pool = CorePool("cpu", nodes)
        self.capacity = self.pool.capacity()
        self.s = ShardedScheduler({"cpu": self.pool}, get_allocator(policy), shards=len(sizes))
        self.sizes = dict(zip(nodes, sizes))
        self.fcfs = policy not in REORDERS
        self.now = 0.0
        self.n = 0
        self.ends: dict[str, float] = {}
        self.arrived: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        for i, n in enumerate(nodes):
            self.s.bind(f"t{i}", "cpu", n)

    @invariant()
    def no_shard_idle_with_work(self) -> None:
        """Asked of each shard process itself: actions queued there mean one runs there. (An
        action waiting behind a first action that fits on no node is held by the router, as
        one scheduler holds it behind that action: FCFS on the cores.)"""
        if not hasattr(self, "s"):
            return
        for i in range(len(self.sizes)):
            queued, running = self.s.state(i)
            assert running or not queued, f"shard {i} runs nothing, queues {queued}"

    @invariant()
    def no_waste(self) -> None:
        """Work conservation per shard: on the router's mirror of a shard's nodes, no action
        the shard queues waits while every amount it allows is free there (the rule of
        `tangram.conservation`, the shard's queue in its order)."""
        if not hasattr(self, "s"):
            return
        s = self.s
        pool = s.pools["cpu"]
        for i, group in enumerate(s.layout.groups):
            mine = {"cpu": CorePool("cpu", {n: pool.cpu_node(n) for n in group})}
            wasted = wasted_now(mine, list(s._queued[i].values()), s.node_of, s.estimate)
            assert not wasted, (i, [(w.action.id, dict(w.units)) for w in wasted])
        # Across shards it does not hold: an action sent to a shard waits there while another
        # shard's node frees first (docs/scale.md, "Work conservation"); not asserted.

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if hasattr(self, "s"):
                self.s.close()


ShardedMachine.TestCase.settings = settings(max_examples=20, stateful_step_count=30, deadline=None)
TestShardedScheduler = ShardedMachine.TestCase
