"""The candidate scan: topology-checked prefix, no cross-pool head-of-line blocking."""

from solvers import get_allocator
from tangram import Action, ClusterView, CorePool, Elasticity
from tangram.scheduler import Scheduler
from topology import CpuNode


def cpu_pool():
    return CorePool("cpu", {"n0": CpuNode("n0", {0: [0, 1]}), "n1": CpuNode("n1", {0: [2, 3]})})


def test_blocked_node_does_not_stall_other_node():
    s = Scheduler({"cpu": cpu_pool()}, get_allocator("min"))
    s.bind("t0", "cpu", "n0")
    s.bind("t1", "cpu", "n1")
    s.submit(Action("big0", {"cpu": 2}, duration=1, trajectory="t0"))
    s.submit(Action("more0", {"cpu": 1}, duration=1, trajectory="t0"))  # n0 now full: waits
    s.submit(Action("on1", {"cpu": 1}, duration=1, trajectory="t1"))  # other node: starts
    started = {a.action.id: a for a in s.decide(0.0)}
    assert set(started) == {"big0", "on1"}
    assert started["on1"].placement["cpu"].node == "n1"
    assert started["big0"].placement["cpu"].cores == (0, 1)


def test_unbound_action_does_not_overtake_onto_blocked_node():
    s = Scheduler({"cpu": cpu_pool()}, get_allocator("min"))
    s.bind("t0", "cpu", "n0")
    s.submit(Action("hold0", {"cpu": 1}, duration=1, trajectory="t0"))
    s.submit(Action("need2", {"cpu": 2}, duration=1, trajectory="t0"))  # n0 has 1 free: waits
    s.submit(Action("free", {"cpu": 1}, duration=1))  # unbound
    started = {a.action.id: a for a in s.decide(0.0)}
    assert set(started) == {"hold0", "free"}
    assert started["free"].placement["cpu"].node == "n1"  # not the blocked n0


def test_elastic_group_is_per_node():
    el = Elasticity("cpu", 4.0, {1: 1.0, 2: 1.0})
    s = Scheduler({"cpu": cpu_pool()}, get_allocator("heuristic"))
    s.bind("a", "cpu", "n0")
    s.bind("b", "cpu", "n1")
    s.submit(Action("ea", {"cpu": [1, 2]}, elasticity=el, trajectory="a"))
    s.submit(Action("eb", {"cpu": [1, 2]}, elasticity=el, trajectory="b"))
    started = {a.action.id: a for a in s.decide(0.0)}
    assert started["ea"].units["cpu"] == 2 and started["eb"].units["cpu"] == 2
    assert started["ea"].placement["cpu"].node == "n0"


def test_view_is_not_mutated_by_policies():
    pools = {"cpu": cpu_pool()}
    view = ClusterView(pools)
    a = Action("x", {"cpu": 2}, duration=1)
    for name in ("min", "heuristic"):
        assert get_allocator(name).allocate(view, [a], 0.0)
        assert pools["cpu"].free() == 4
