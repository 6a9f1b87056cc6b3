"""Timeouts reach the scheduler: an estimate never exceeds `Action.timeout`, the simulator kills
an action there, and a timed-out run is learned as a censored observation (at its timeout),
by the one rule the runtime uses too (`DurationProfiles.record`)."""

from __future__ import annotations

import pytest

from evaluation.simulator import Simulator
from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.errors import ValidationError
from tangram.pools import FlatPool
from tangram.profiles import DurationProfiles
from tangram.results import Status


def test_estimates_are_clipped_to_the_timeout_truth_is_kept():
    a = Action("a", {"cpu": 1}, duration=10.0, timeout=3.0)
    assert a.duration == 10.0 and a.duration_at() == 3.0
    el = Elasticity("cpu", 8.0, {1: 1.0, 2: 1.0, 4: 1.0})
    b = Action("b", {"cpu": [1, 2, 4]}, elasticity=el, timeout=3.0)
    assert [d for _, d in b.options] == [3.0, 3.0, 2.0]
    assert DurationProfiles().estimate(Action("c", {"cpu": 1}, kind="k", timeout=0.5)) == 0.5
    with pytest.raises(ValidationError, match="timeout"):
        Action("d", {"cpu": 1}, timeout=0)


@pytest.mark.parametrize(
    "status,learned",
    [
        (Status.OK, 2.0),
        (Status.ERROR, 2.0),
        (Status.TIMEOUT, 2.0),
        (Status.FAILED, None),
        (Status.CANCELLED, None),
    ],
)
def test_the_learning_rule(status, learned):
    p = DurationProfiles()
    p.record(Action("a", {"cpu": 1}, kind="k"), {"cpu": 1}, 2.0, status)
    assert p.mean("k") == learned


def test_the_simulator_kills_at_the_timeout_and_learns_it_censored():
    acts = [
        Action("slow", {"cpu": 1}, duration=10.0, timeout=3.0, kind="k"),
        Action("next", {"cpu": 1}, duration=1.0, kind="k", submit_time=0.5),
    ]
    sim = Simulator({"cpu": FlatPool("cpu", {"n": 1})}, acts, get_allocator("heuristic"))
    res = sim.run()
    slow = res.records["slow"]
    assert slow.status is Status.TIMEOUT and slow.end - slow.start == 3.0
    assert res.records["next"].start == 3.0 and res.records["next"].status is Status.OK
    assert res.counters["timeouts"] == 1
    assert sim.scheduler.profiles.mean("k") == pytest.approx((3.0 + 1.0) / 2)
