"""`tangram.scheduler` where the suite did not look (mutation testing, docs/mutation.md): a
prepared decision (the policy off the event loop) grants what `decide` grants and reads a view
of its own, a duplicate id is refused, an unknown resource is named, the resources the queue
needs are counted exactly, and a run that never ended teaches the profiles nothing."""

from __future__ import annotations

import pytest

from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.errors import ValidationError
from tangram.pools import CorePool, FlatPool
from tangram.profiles import amdahl
from tangram.results import Status
from tangram.scheduler import Scheduler
from topology import CpuNode


def pools():
    return {
        "cpu": CorePool("cpu", {n: CpuNode(n, {0: (0, 1, 2, 3)}) for n in ("n0", "n1")}),
        "api": FlatPool("api", {"n0": 2}),
    }


def workload() -> list[Action]:
    el = Elasticity("cpu", 4.0, amdahl(0.2))
    return [
        Action("a", {"cpu": (1, 4)}, elasticity=el, trajectory="t0"),
        Action("b", {"cpu": 2, "api": 1}, duration=2.0, trajectory="t1"),
        Action("c", {"cpu": 3}, duration=1.0),
        Action("d", {"api": 1}, duration=1.0),
    ]


def scheduler(policy: str, scoped: bool) -> Scheduler:
    s = Scheduler(pools(), get_allocator(policy), scoped=scoped)
    s.bind("t0", "cpu", "n0")
    s.bind("t1", "cpu", "n1")
    return s


def grants(assignments) -> list[tuple[str, dict, dict]]:
    return sorted(
        (a.action.id, dict(a.units), {r: p.node for r, p in a.placement.items()})
        for a in assignments
    )


@pytest.mark.parametrize("policy", ["heuristic", "min", "backfill"])
@pytest.mark.parametrize("scoped", [False, True])
def test_a_prepared_decision_grants_what_decide_grants(policy, scoped):
    one, two = scheduler(policy, scoped), scheduler(policy, scoped)
    for s in (one, two):
        s.submit(Action("running", {"cpu": 1}, duration=5.0, trajectory="t1"))
        s.decide(0.0)
        for a in workload():
            s.submit(a)
    decided = one.decide(1.0)
    p = two.prepare(1.0)
    assert p is not None
    assert p.view.bindings[("t0", "cpu")] == "n0"
    assert [ra.assignment.action_id for ra in p.view.running_on("cpu", "n1")] == ["running"]
    assert set(p.view.queued_resources) == {"cpu", "api"}
    finished = two.finish(p, p.allocate(), 1.0)
    assert decided and grants(finished) == grants(decided)
    assert two.queue.visited == one.queue.visited > 0
    assert sorted(two.running) == sorted(one.running)


def test_a_prepared_grant_whose_node_left_is_dropped():
    s = Scheduler(
        {"cpu": CorePool("cpu", {"n0": CpuNode("n0", {0: (0, 1)})})}, get_allocator("min")
    )
    s.submit(Action("a", {"cpu": 1}, duration=1.0))
    p = s.prepare(0.0)
    answer = p.allocate()
    assert [a.action.id for a in answer] == ["a"]
    s.pools["cpu"].remove_node("n0")
    assert s.finish(p, answer, 0.0) == [] and "a" in s.queue


def test_an_id_queued_or_running_is_refused():
    s = Scheduler(pools(), get_allocator("min"))
    s.submit(Action("a", {"cpu": 1}, duration=1.0))
    with pytest.raises(ValidationError) as e:
        s.submit(Action("a", {"cpu": 1}, duration=1.0))
    assert e.value.value == "a"
    s.decide(0.0)
    assert "a" in s.running
    with pytest.raises(ValidationError):
        s.submit(Action("a", {"api": 1}, duration=1.0))


def test_an_unknown_resource_is_named_with_the_pools():
    s = Scheduler(pools(), get_allocator("min"))
    with pytest.raises(ValidationError) as e:
        s.submit(Action("a", {"disk": 1}, duration=1.0))
    assert e.value.field == "action[a].demands.disk"
    assert "api" in e.value.problem and "cpu" in e.value.problem


def test_the_view_names_exactly_the_resources_queued_actions_need():
    s = Scheduler(pools(), get_allocator("min"))
    assert set(s.view().queued_resources) == set()
    s.submit(Action("a", {"cpu": 1, "api": 1}, duration=1.0))
    s.submit(Action("b", {"api": 1}, duration=1.0))
    assert set(s.view().queued_resources) == {"cpu", "api"}
    s.cancel("b")
    assert set(s.view().queued_resources) == {"cpu", "api"}
    s.decide(0.0)
    assert set(s.view().queued_resources) == set()
    s.submit(Action("c", {"api": 1}, duration=1.0))
    assert set(s.view().queued_resources) == {"api"}


@pytest.mark.parametrize("status", [Status.FAILED, Status.CANCELLED])
def test_a_run_that_never_ended_teaches_nothing(status):
    s = Scheduler(pools(), get_allocator("min"))
    s.submit(Action("a", {"api": 1}, kind="k"))
    s.decide(0.0)
    s.complete("a", 7.0, status=status)
    assert s.profiles.mean("k") is None
    s.submit(Action("b", {"api": 1}, kind="k"))
    s.decide(7.0)
    s.complete("b", 10.0)
    assert s.profiles.mean("k") == pytest.approx(3.0)
