"""Per-pool placement advisors: each chunk pool with services keeps its own residency advice
(`Pool.advisor`), so a second GPU pool no longer loses its preference to the first (the old
cluster-wide `ClusterView.prefer` hook was overwritten by whichever pool was built last)."""

from __future__ import annotations

import pytest

from evaluation.simulator import simulate
from managers.gpu.advisor import ResidencyAdvisor
from managers.gpu.sim import SimServiceModel
from solvers import get_allocator
from tangram.instance import parse_instance

SERVICES = {"s1": {"memory_gb": 60, "restore_s": 2.0}, "s2": {"memory_gb": 60, "restore_s": 2.0}}


def two_pools():
    pool = {
        "topology": "chunks",
        "nodes": 1,
        "gpus_per_node": 2,
        "memory_gb": 80,
        "services": SERVICES,
    }
    acts = []
    for r in ("gpu", "tpu"):
        # s1 and s2 each get a GPU at t=0; at t=10 s2 again: its resident GPU is the second,
        # first fit would take the first and restore (evicting s1)
        for i, (t, s) in enumerate([(0.0, "s1"), (0.0, "s2"), (10.0, "s2")]):
            acts.append(
                {"id": f"{r}{i}", "arrival": t, "demand": {r: [1]}, "duration": 1.0, "service": s}
            )
    return parse_instance({"resources": {"gpu": pool, "tpu": pool}, "actions": acts})


@pytest.mark.parametrize("policy", ["heuristic", "min", "backfill"])
def test_every_pool_keeps_its_own_residency_preference(policy):
    res = simulate(two_pools(), get_allocator(policy)).records
    for r in ("gpu", "tpu"):
        assert [res[f"{r}{i}"].restored for i in range(3)] == [True, True, False], r


def test_the_advisor_is_the_pools_and_survives_a_copy():
    inst = two_pools()
    pools = inst.build_pools()
    models = {r: SimServiceModel(spec) for r, spec in inst.resources.items()}
    for r, m in models.items():
        pools[r].advisor = m.advisor
    assert isinstance(pools["gpu"].advisor, ResidencyAdvisor)
    assert pools["gpu"].advisor is not pools["tpu"].advisor
    assert pools["gpu"].copy().advisor is pools["gpu"].advisor
