"""The liveness rule (`tangram.liveness.rescue`) called directly on idle pools: the bound node
decides both the amount and the placement, an action that does not fit is passed over for one
behind it that does, and "nothing fits" is None (mutation testing, docs/mutation.md)."""

from __future__ import annotations

from tangram.actions import Action, Elasticity
from tangram.liveness import rescue
from tangram.pools import CorePool, FlatPool
from tangram.profiles import amdahl
from tangram.queue import ActionQueue
from topology import CpuNode


def cores(**nodes: int) -> CorePool:
    return CorePool("cpu", {n: CpuNode(n, {0: tuple(range(c))}) for n, c in nodes.items()})


def elastic(aid: str, lo: int, hi: int) -> Action:
    return Action(aid, {"cpu": (lo, hi)}, elasticity=Elasticity("cpu", 8.0, amdahl(0.0)))


def queue(*actions: Action) -> ActionQueue:
    q = ActionQueue()
    for a in actions:
        q.add(a, [(r, None) for r in a.mins])
    return q


def bound(node: str | None):
    """The binding of every action on the CPU pool (a binding is per resource)."""
    return lambda action, resource: node if resource == "cpu" else None


def test_a_bound_action_gets_the_fastest_amount_its_node_holds_on_that_node():
    pools = {"cpu": cores(small=2, big=8)}
    a = rescue(pools, queue(elastic("e", 1, 8)), bound("small"))
    assert a is not None
    assert a.placement["cpu"].node == "small"
    assert a.units["cpu"] == 2  # the fastest amount small holds (not the minimum, not 8)
    assert len(a.placement["cpu"].cores) == 2
    assert pools["cpu"].free("small") == 2, "rescue chooses on a copy: the pool is untouched"


def test_an_unbound_action_whose_fastest_amount_spans_nodes_still_starts():
    """Free units summed over nodes hold 8, no node does: the amount falls back, the action
    still starts (on one node, within what it allows)."""
    a = rescue({"cpu": cores(n0=4, n1=4)}, queue(elastic("e", 1, 8)), bound(None))
    assert a is not None and a.action.id == "e"
    assert 1 <= a.units["cpu"] <= 4
    assert len(a.placement["cpu"].cores) == a.units["cpu"]


def test_an_action_that_does_not_fit_its_node_is_passed_over():
    pools = {"cpu": cores(small=2, big=8)}
    nodes = {"wide": "small", "next": "big"}
    q = queue(elastic("wide", 3, 4), Action("next", {"cpu": 1}, duration=1.0))
    a = rescue(pools, q, lambda action, r: nodes[action.id])
    assert a is not None and a.action.id == "next"
    assert a.placement["cpu"].node == "big"


def test_nothing_fits_is_none():
    assert rescue({"cpu": cores(n0=2)}, queue(elastic("wide", 3, 4)), bound("n0")) is None
    assert rescue({"cpu": cores(n0=2)}, queue(elastic("wide", 3, 4)), bound(None)) is None


def test_every_resource_must_fit_not_only_the_key():
    pools = {"cpu": cores(n0=4), "api": FlatPool("api", {"n0": 1})}
    two = Action("two", {"cpu": (1, 4), "api": 2}, elasticity=Elasticity("cpu", 4.0, amdahl(0.0)))
    one = Action("one", {"cpu": 1, "api": 1}, duration=1.0)
    a = rescue(pools, queue(two, one), bound(None))
    assert a is not None and a.action.id == "one"
    assert a.units == {"cpu": 1, "api": 1}
