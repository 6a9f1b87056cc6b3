"""Survivors of mutation testing in the heuristic (`solvers/heuristic/policy.py`,
docs/mutation.md) that a behaviour pins: a lone elastic candidate takes its fastest amount, the
smallest among equally fast ones (as the DP's `OneTask` does: more units for no gain would only
keep them from others)."""

from __future__ import annotations

import pytest

from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.allocation import ClusterView
from tangram.pools import FlatPool
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
