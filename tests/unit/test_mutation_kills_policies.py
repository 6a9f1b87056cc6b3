"""Every queue-order policy hands the decision's time to the pools' advisors: an advisor that
would rather the action waited until t=5 holds it back before then and not after (mutation
testing, docs/mutation.md: a policy that dropped `now` passed every other test)."""

from __future__ import annotations

import pytest

from solvers import get_allocator
from tangram.actions import Action
from tangram.allocation import ClusterView
from tangram.pools import FlatPool, PlacementAdvisor
from tangram.queue import ActionQueue


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
