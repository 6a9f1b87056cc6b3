"""Every queue-order policy hands the decision's time to the pools' advisors: an advisor that
would rather the action waited until t=5 holds it back before then and not after (mutation
testing, docs/mutation.md: a policy that dropped `now` passed every other test)."""

from __future__ import annotations

import pytest

from solvers import get_allocator
from solvers.fcfs import ScratchPools
from tangram.actions import Action
from tangram.allocation import ClusterView
from tangram.pools import CorePool, FlatPool, PlacementAdvisor
from tangram.queue import ActionQueue
from topology import CpuNode


class UntilFive(PlacementAdvisor):
    def __init__(self) -> None:
        self.asked: list[float] = []

    def prefer(self, action, node, chunk):
        return 0.0

    def defer(self, action, placement, view, now):
        self.asked.append(now)
        return now < 5.0


@pytest.mark.parametrize("policy", ["min", "heuristic", "backfill", "backfill-srpt"])
def test_the_advisor_is_asked_at_the_decisions_time(policy):
    pool = FlatPool("api", {"n0": 2})
    pool.advisor = advisor = UntilFive()
    q = ActionQueue()
    q.add(Action("a", {"api": 1}, duration=1.0), [("api", None)])
    view = ClusterView({"api": pool})
    alloc = get_allocator(policy)
    assert alloc.allocate(view, q, 1.0) == []
    assert advisor.asked and set(advisor.asked) == {1.0}
    advisor.asked.clear()
    started = alloc.allocate(view, q, 10.0)
    assert [a.action.id for a in started] == ["a"]
    assert set(advisor.asked) == {10.0}


def test_an_action_waiting_behind_a_blocked_pool_blocks_its_other_pools_too():
    """X blocks the cores; A waits behind it and so also holds the API slot's queue: B, which
    needs only that slot, may not overtake A (it contends with A). On a plain sequence of
    actions and on the indexed `ActionQueue` alike (its scan once skipped A, so A blocked
    nothing there and B started: docs/mutation.md, "Found"; `test_queue_equivalence.py`)."""
    pools = {
        "cpu": CorePool("cpu", {"n0": CpuNode("n0", {0: (0, 1, 2, 3)})}),
        "api": FlatPool("api", {"n0": 1}),
    }
    q = ActionQueue()
    for a in (
        Action("X", {"cpu": 4}, duration=1.0),
        Action("A", {"cpu": 1, "api": 1}, duration=1.0),
        Action("B", {"api": 1}, duration=1.0),
    ):
        q.add(a, [(r, None) for r in a.mins])
    pools["cpu"].place(1, "n0")  # one core busy: X (4) cannot fit
    for policy in ("min", "heuristic"):  # (a backfiller may start A: it ends before X can)
        for queue in (list(q), q):
            assert get_allocator(policy).allocate(ClusterView(pools), queue, 0.0) == [], policy


def test_an_unbound_action_never_takes_a_node_an_earlier_action_waits_for():
    pools = {"cpu": CorePool("cpu", {n: CpuNode(n, {0: (0, 1, 2, 3)}) for n in ("n0", "n1")})}
    pools["cpu"].place(1, "n0")  # n0: 3 free, n1: 4 free
    pools["cpu"].place(3, "n1")  # n1: 1 free
    q = ActionQueue()
    x = Action("X", {"cpu": 4}, duration=1.0, trajectory="tx")
    y = Action("Y", {"cpu": 1}, duration=1.0)
    q.add(x, [("cpu", "n0")])
    q.add(y, [("cpu", None)])
    view = ClusterView(pools, bindings={("tx", "cpu"): "n0"})
    (a,) = get_allocator("min").allocate(view, q, 0.0)
    assert a.action.id == "Y" and a.placement["cpu"].node == "n1"


def test_scratch_pools_are_the_pools_by_name():
    src = {"api": FlatPool("api", {"n0": 1}), "io": FlatPool("io", {"n0": 2})}
    scratch = ScratchPools(src)
    assert list(scratch) == ["api", "io"] and len(scratch) == 2
    assert scratch["io"] is not src["io"] and scratch["io"].free() == 2
    assert scratch["io"] is scratch["io"]  # copied once
