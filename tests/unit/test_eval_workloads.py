"""Workload generators: documented parameters, reproducible seeds, the paper's calibration."""

import dataclasses

import pytest

from evaluation.baselines import ApiRetry, Kubernetes
from evaluation.closedloop import Policy, run
from evaluation.params import assumed, check_sources, src
from evaluation.workloads import available, get_workload, sources
from evaluation.workloads.gpu import MopdParams, teacher_weights
from solvers import get_allocator

NAMES = ["coding", "deepsearch", "mopd", "mopd+search"]


def test_all_registered():
    assert set(NAMES) <= set(available())


@pytest.mark.parametrize("name", NAMES)
def test_seed_reproducible_and_different(name):
    a, b = get_workload(name, batch=6, seed=3), get_workload(name, batch=6, seed=3)
    c = get_workload(name, batch=6, seed=4)
    sig = lambda w: [
        (t.start, [(s.think_s, s.action.id, s.action.duration_at()) for s in t.steps])
        for t in w.trajectories
    ]
    assert sig(a) == sig(b)
    assert sig(a) != sig(c)


@pytest.mark.parametrize("name", NAMES)
def test_every_parameter_is_sourced_or_assumed_with_a_range(name):
    w = get_workload(name, batch=2)
    params = w.params if isinstance(w.params, tuple) else (w.params,)
    for p in params:
        assert check_sources(type(p)()) == []  # the defaults, not this test's batch
        assert sources(p)


@pytest.mark.parametrize("cls", [Kubernetes, ApiRetry])
def test_every_baseline_parameter_is_sourced_or_assumed(cls):
    assert check_sources(cls()) == []


def test_source_check_fails_without_a_source_or_a_range():
    @dataclasses.dataclass(frozen=True)
    class Bad:
        plain: float = 1.0  # no metadata at all
        vague: float = dataclasses.field(default=2.0, metadata={"source": "assumption"})
        no_range: float = dataclasses.field(
            default=3.0, metadata={**assumed("x", 0, 1), "range": None}
        )
        outside: float = dataclasses.field(default=5.0, metadata=assumed("y", 0.0, 1.0))
        empty: float = dataclasses.field(default=1.0, metadata=src(" "))
        good: float = dataclasses.field(default=0.5, metadata=assumed("z", 0.0, 1.0))
        sourced: float = dataclasses.field(default=0.5, metadata=src("a paper"))

    problems = check_sources(Bad())
    for name in ("plain", "vague", "no_range", "outside", "empty"):
        assert any(f"Bad.{name}:" in p for p in problems), (name, problems)
    assert not any("good" in p or "sourced" in p for p in problems)


def test_coding_active_share_is_the_papers_47_percent():
    # minimum demands, a cluster large enough for no queueing: the generator's calibration
    w = get_workload("coding", batch=48, nodes=1, cores_per_node=256, seed=1)
    r = run(w, Policy("min", get_allocator("min")))
    assert sum(x.start - x.arrival for x in r.records.values()) < 1e-6
    assert 0.40 <= r.active_share() <= 0.54


def test_coding_shape():
    w = get_workload("coding", batch=20)
    for t in w.trajectories:
        assert t.steps[-1].action.kind == "reward" and t.steps[-1].action.is_elastic
        assert all(s.action.kind == "tool" for s in t.steps[:-1])
        assert 2 <= len(t.steps) <= 101


def test_mopd_burstiness_spans_three_orders():
    import random

    w = teacher_weights(MopdParams(), random.Random(0))
    assert max(w) / min(w) == pytest.approx(1000.0)
    calls = get_workload("mopd", batch=400)
    services = [s.action.service for t in calls.trajectories for s in t.steps]
    counts = sorted(services.count(x) for x in set(services))
    assert counts[-1] >= 5 * counts[0]


def test_mopd_search_shares_one_gpu_pool():
    w = get_workload("mopd+search", batch=4)
    assert set(w.tasks) == {"mopd", "search"}
    assert w.gpu is not None and "judge" in w.gpu.services and "teacher0" in w.gpu.services
    assert dataclasses.is_dataclass(w.params[0])
