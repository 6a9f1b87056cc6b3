"""A scoped scheduler re-reads a put-off class at the next event on its node or when its due
time comes (`tangram.rereads`, docs/scale.md "Scoped decisions"), not at every decision of the
cluster: what made a put-off class cost the cluster's whole decision rate (issue 28)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from evaluation.rereadcheck import compare
from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.pools import CorePool
from tangram.rereads import Rereads
from tangram.scheduler import Scheduler
from topology import CpuNode

A, B = ("cpu", "n0"), ("cpu", "n1")


def test_a_class_is_due_once_at_its_last_time():
    r = Rereads()
    assert not r and r.next_due() is None and r.take(10.0) == []
    r.due(A, 2.0)
    r.due(B, 1.0)
    r.due(A, 3.0)  # the last due wins
    assert r.next_due() == 1.0
    assert r.take(2.5) == [B]
    assert r.next_due() == 3.0 and r
    r.drop([A])  # read meanwhile
    assert not r and r.next_due() is None and r.take(9.0) == []


@given(st.lists(st.tuples(st.sampled_from([A, B, ("cpu", None)]), st.floats(0, 10)), max_size=12))
def test_take_returns_each_class_at_its_last_due(events):
    r = Rereads()
    last = {}
    for c, t in events:
        r.due(c, t)
        last[c] = t
    assert r.next_due() == (min(last.values()) if last else None)
    got = r.take(5.0)
    assert len(got) == len(set(got)) and set(got) == {c for c, t in last.items() if t <= 5.0}
    assert set(r.take(10.0)) == {c for c, t in last.items() if t > 5.0} and not r


def _put_off() -> Scheduler:
    """n0 (6 cores): x holds 3 until 1; the elastic e (8 s of perfectly elastic work) is put off
    to wait for all 6 at 1 rather than take the 3 free now. n1 (1 core) serves short calls."""
    pools = {
        "cpu": CorePool(
            "cpu", {n: CpuNode(n, {0: tuple(range(c))}) for n, c in (("n0", 6), ("n1", 1))}
        )
    }
    s = Scheduler(pools, get_allocator("heuristic"), scoped=True, conserve=False)
    for t, n in (("ta", "n0"), ("tb", "n1")):
        s.bind(t, "cpu", n)
    s.submit(Action("x", {"cpu": 3}, duration=1.0, trajectory="ta"))
    assert [a.action.id for a in s.decide(0.0)] == ["x"]
    e = Elasticity("cpu", 8.0, lambda m: 1.0)
    s.submit(Action("e", {"cpu": (1, 6)}, elasticity=e, trajectory="ta"))
    assert s.decide(0.0) == [] and "e" in s.queue  # put off
    return s


def test_a_put_off_class_is_read_at_its_due_time_not_at_every_decision():
    s = _put_off()
    assert s.wants_next_decision() == 1.0  # x's estimated end
    for i, now in enumerate((0.2, 0.5, 0.9)):  # events on n1 only
        s.submit(Action(f"b{i}", {"cpu": 1}, duration=0.1, trajectory="tb"))
        assert [a.action.id for a in s.decide(now)] == [f"b{i}"]
        assert s.last_scope == [B]  # n0 is not read again
        s.complete(f"b{i}", now + 0.1)
    s.submit(Action("b9", {"cpu": 1}, duration=0.1, trajectory="tb"))
    got = {a.action.id for a in s.decide(1.0)}
    # x has not ended, but its estimated end has come: n0 is read again, and by the estimate
    # what e waits for is free now, so it starts with what is free (the heuristic's rule)
    assert s.last_scope == [A, B] and "e" in got


def test_an_event_on_the_node_reads_it_before_its_due_time():
    s = _put_off()
    s.submit(Action("y", {"cpu": 1}, duration=0.1, trajectory="ta"))
    s.decide(0.3)
    assert A in s.last_scope
    s.complete("x", 0.6)  # early: e gets the whole node now
    got = {a.action.id: a.units["cpu"] for a in s.decide(0.6)}
    assert got.get("e", 0) >= 5, got


def test_the_rule_grants_what_reading_at_every_decision_granted_on_the_bench_cluster():
    """Coding at batch 512 on 4 x 128 cores, 0-120 s: the same grants, decision by decision,
    as the rule before issue 28 (larger sizes: `python -m evaluation.rereadcheck`)."""
    r = compare("coding", 512, 120.0)
    assert r["first_difference"] is None and r["grants"] > 10_000
