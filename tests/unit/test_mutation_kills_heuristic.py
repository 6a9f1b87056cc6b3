"""Survivors of mutation testing in the heuristic (`solvers/heuristic/policy.py`,
docs/mutation.md) that a behaviour pins: a lone elastic candidate takes its fastest amount, the
smallest among equally fast ones (as the DP's `OneTask` does: more units for no gain would only
keep them from others)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from solvers import get_allocator
from solvers.heuristic.backfill import estimated_starts
from solvers.heuristic.timeline import CountTimeline
from tangram.actions import Action, Elasticity
from tangram.allocation import Assignment, ClusterView, RunningAction
from tangram.pools import FlatPool, Placement
from tangram.queue import ActionQueue


@pytest.mark.parametrize("policy", ["heuristic", "backfill", "backfill-srpt"])
def test_a_lone_candidate_takes_the_smallest_of_equally_fast_amounts(policy):
    # E(2) = 0.5: 2 units run exactly as long as 1 (t_ori / (E * m) = 4 both)
    a = Action("a", {"cpu": [1, 2]}, elasticity=Elasticity("cpu", 4.0, {1: 1.0, 2: 0.5}))
    q = ActionQueue()
    q.add(a, [("cpu", None)])
    (got,) = get_allocator(policy).allocate(ClusterView({"cpu": FlatPool("cpu", {"n0": 4})}), q, 0)
    assert got.units == {"cpu": 1}


@pytest.mark.parametrize("policy", ["heuristic", "backfill", "backfill-srpt"])
def test_a_lone_candidate_takes_its_fastest_amount_that_fits(policy):
    a = Action("a", {"cpu": [1, 2, 4]}, elasticity=Elasticity("cpu", 4.0, {1: 1.0, 2: 0.9, 4: 0.8}))
    q = ActionQueue()
    q.add(a, [("cpu", None)])
    pool = FlatPool("cpu", {"n0": 4})
    (got,) = get_allocator(policy).allocate(ClusterView({"cpu": pool}), q, 0)
    assert got.units == {"cpu": 4}


def _held(pools, aid, node, units, end):
    """A running action holding `units` ({resource: k}) on `node` until `end` (taken in the
    pools, as the scheduler holds it)."""

    a = Action(aid, {r: k for r, k in units.items()}, duration=end)
    placement = {r: Placement(node) for r in units}
    for r, k in units.items():
        pools[r].take(placement[r], k)
    return RunningAction(Assignment(a, dict(units), placement), 0.0, end)


def test_a_two_resource_reservation_waits_for_both_on_its_bound_node():
    """A waiting action needing cores and a GPU count on its trajectory's node is reserved
    where both are free for its run on that node (the fixed point over the resources: cores at
    10, the GPU at 20), not on the idle node beside it; with the cores free now and the GPU
    free half a second later, at that half second."""

    for cpu_end, gpu_end, want in ((10.0, 20.0, 20.0), (None, 0.5, 0.5)):
        pools = {
            "cpu": FlatPool("cpu", {"n0": 4, "n1": 4}),
            "gpu": FlatPool("gpu", {"n0": 2, "n1": 2}),
        }
        running = [_held(pools, "r2", "n1", {"gpu": 2}, gpu_end)]
        if cpu_end is not None:
            running.append(_held(pools, "r1", "n1", {"cpu": 4}, cpu_end))
        view = ClusterView(
            pools, running, MappingProxyType({("t", "cpu"): "n1", ("t", "gpu"): "n1"})
        )
        a = Action("a", {"cpu": 2, "gpu": 1}, duration=5.0, trajectory="t")
        res = estimated_starts(view, [a], 0.0, [])
        assert res["a"].start == want and dict(res["a"].units) == {"cpu": 2, "gpu": 1}


def test_a_window_ends_where_the_next_reservation_begins():
    """Units reserved from 5 s on leave [0, 5) whole: a run of exactly 5 s fits now beside
    them, a run a little longer does not."""

    tl = CountTimeline(0.0, {"n0": 4}, [])
    tl.take(("n0", None), 3, 5.0, 10.0)
    free = lambda slot: True  # the pool's own check (free now): yes
    assert tl.fits_now(4, 5.0, "n0", free) == ("n0", None)
    assert tl.fits_now(4, 5.001, "n0", free) is None
    assert tl.fits_now(1, 7.0, "n0", free) == ("n0", None)
