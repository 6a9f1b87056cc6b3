"""`tangram.conservation` with advisors and scopes (mutation testing, docs/mutation.md): the
pools' advisors place the wasting action where they prefer and excuse a deferral at the time
asked, a scoped walk reads only its classes, and a replayed schedule's report names each
interval's fields."""

from __future__ import annotations

from tangram.actions import Action
from tangram.allocation import ClusterView
from tangram.conservation import advisors_excuse, check_schedule, wasted_now
from tangram.pools import ChunkPool, CorePool, Placement, PlacementAdvisor
from tangram.queue import ActionQueue
from tangram.results import ScheduledAction
from topology import ChunkTree, CpuNode


class Advisor(PlacementAdvisor):
    """Prefers node g1; would rather every action waited until t=5."""

    def __init__(self) -> None:
        self.deferred: list[tuple[str, str, float]] = []

    def prefer(self, action, node, chunk):
        return 1.0 if node == "g1" else 0.0

    def defer(self, action, placement, view, now):
        self.deferred.append((action.id, placement.node, now))
        return now < 5.0


def gpus() -> ChunkPool:
    pool = ChunkPool("gpu", {n: ChunkTree(2, n) for n in ("g0", "g1")})
    pool.advisor = Advisor()
    return pool


def unbound(action, resource):
    return None


def test_the_wasting_action_is_placed_where_the_pools_advisor_prefers():
    pools = {"gpu": gpus()}
    (w,) = wasted_now(pools, [Action("a", {"gpu": 1}, duration=1.0)], unbound)
    assert w.placement["gpu"].node == "g1"


def test_a_deferral_is_excused_at_the_time_asked_and_only_then():
    pools = {"gpu": gpus()}
    adv = pools["gpu"].advisor
    view = ClusterView(pools)
    a = Action("a", {"gpu": 1}, duration=1.0)
    early = advisors_excuse(pools, view, 1.0)
    late = advisors_excuse(pools, view, 10.0)
    assert early is not None and late is not None
    assert early(a, {"gpu": Placement("g1", chunk=(0, 1))}) is True
    assert late(a, {"gpu": Placement("g1", chunk=(0, 1))}) is False
    assert adv.deferred == [("a", "g1", 1.0), ("a", "g1", 10.0)]
    assert wasted_now(pools, [a], unbound, excused=early) == []
    assert [w.action.id for w in wasted_now(pools, [a], unbound, excused=late)] == ["a"]
    plain = {"cpu": CorePool("cpu", {"n0": CpuNode("n0", {0: (0, 1)})})}
    assert advisors_excuse(plain, ClusterView(plain), 1.0) is None


def test_a_scoped_walk_reads_only_its_classes():
    pools = {"cpu": CorePool("cpu", {n: CpuNode(n, {0: (0, 1)}) for n in ("n0", "n1")})}
    node = {"t0": "n0", "t1": "n1"}
    q = ActionQueue()
    for aid, traj in (("a0", "t0"), ("a1", "t1")):
        q.add(Action(aid, {"cpu": 1}, duration=1.0, trajectory=traj), [("cpu", node[traj])])

    def node_of(action, resource):
        return node[action.trajectory]

    assert [w.action.id for w in wasted_now(pools, q, node_of)] == ["a0", "a1"]
    assert [w.action.id for w in wasted_now(pools, q, node_of, scope=[("cpu", "n1")])] == ["a1"]


def test_the_report_names_each_intervals_fields():
    pools = {"cpu": CorePool("cpu", {"n0": CpuNode("n0", {0: (0, 1)})})}
    a = Action("a", {"cpu": 1}, duration=1.0, submit_time=0.0)
    late = ScheduledAction(
        a, a.submit_time, 2.0, 3.0, {"cpu": 1}, {"cpu": Placement("n0", cores=(0,))}
    )
    report = check_schedule(pools, [late])
    assert report.to_json() == {
        "idle_unit_seconds": 2.0,
        "intervals": [{"action": "a", "start": 0.0, "end": 2.0, "units": {"cpu": 1}}],
    }
