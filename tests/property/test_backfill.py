"""Conservative backfilling: the promise (no backfiller makes the estimated start of an action
ahead of it later), no starvation under adversarial arrivals and wrong estimates, invariants."""

import random
from collections.abc import Collection
from pathlib import Path

from grammar import instances as grammar_instances
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.simulator import Simulator, simulate
from solvers import get_allocator
from solvers.heuristic.backfill import BackfillAllocator, estimated_starts, srpt_order
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.instance import load_instance
from tangram.pools import FlatPool
from tangram.profiles import DurationProfiles

EPS = 1e-9
SCEN = Path(__file__).parents[1] / "scenarios"


class PromiseChecker:
    """Runs `backfill` and, at every decision, checks the promise against `estimated_starts`:
    for each backfilled action b and each waiting action w ahead of b in the queue, w's
    estimated start with b started is no later than with b left waiting."""

    def __init__(self, policy: BackfillAllocator) -> None:
        self.policy = policy
        self.checked = 0

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        d = self.policy.decide(view, queue, now)
        order = (
            srpt_order(view, queue, now, self.policy.aging)
            if self.policy.order == "srpt"
            else list(queue)
        )
        started = {a.action.id for a in d.assignments}
        with_all = estimated_starts(view, order, now, d.assignments)
        for w, res in d.reservations.items():  # the decision's own estimate is the same one
            assert abs(with_all[w].start - res.start) <= EPS, (w, with_all[w], res)
        pos = {a.id: i for i, a in enumerate(order)}
        for b in d.backfilled:
            without = estimated_starts(
                view, order, now, [a for a in d.assignments if a.action.id != b]
            )
            for w, res in with_all.items():
                if pos[w] < pos[b] and w not in started:
                    assert res.start <= without[w].start + EPS, (b, w, res, without[w])
                    self.checked += 1
        return d.assignments


def instances():
    """The instance grammar (tests/grammar.py): any pools, nodes, vector actions; no services
    (a deferral to a resident copy is an advisor's choice the promise does not speak of)."""
    return grammar_instances(3, 14, services=False)


def test_the_promise_checker_sees_backfills_on_the_hand_worked_scenarios():
    """The property below is not vacuous: on the scenario files, backfills happen, with an
    action ahead of each of them whose estimated start the checker compares."""
    checked = 0
    for name in ("backfill_hol", "backfill_chunks", "backfill_elastic_units"):
        checker = PromiseChecker(BackfillAllocator())
        simulate(load_instance(SCEN / f"{name}.json"), checker)
        assert checker.checked > 0, name
        checked += checker.checked
    assert checked >= 3


@settings(max_examples=60, deadline=None)
@given(instances(), st.sampled_from(["fcfs", "srpt"]))
def test_backfilling_never_delays_the_estimated_start_of_an_action_ahead(inst, order):
    checker = PromiseChecker(BackfillAllocator(order=order))
    result = simulate(inst, checker)
    assert set(result.records) == {a.id for a in inst.actions}


class WrongProfiles(DurationProfiles):
    """Estimates off by a factor per action kind (the run time stays the modelled one)."""

    def __init__(self, factors: dict[str, float]) -> None:
        super().__init__()
        self.factors = factors

    def estimate(self, action: Action, units: int | None = None) -> float:
        return self.factors.get(action.kind, 1.0) * super().estimate(action, units)


def _run(pools, actions, policy, factors):
    sim = Simulator(pools, actions, policy)
    sim.scheduler.profiles = WrongProfiles(factors)
    return sim.run()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(2, 6),
    st.lists(st.floats(0, 40), min_size=1, max_size=4),
    st.floats(0.25, 4),
    st.floats(0.25, 4),
    st.sampled_from(["fcfs", "srpt"]),
    st.integers(0, 2**32),
)
def test_wide_actions_start_while_a_stream_of_small_ones_could_backfill_forever(
    units, wide_at, small_factor, wide_factor, order, seed
):
    """Adversarial arrivals: a stream of 1-unit actions keeps the pool busy for 200 s, enough
    to fill every gap beside a waiting wide action. With any estimate error (each kind off by
    its own factor), every wide action still starts long before the stream ends."""
    rng = random.Random(seed)
    actions = []
    t, i = 0.0, 0
    while t < 200:
        actions.append(
            Action(
                f"s{i}", {"cpu": [1]}, duration=rng.uniform(0.2, 2.0), kind="small", submit_time=t
            )
        )
        t += rng.uniform(0.05, 0.8) * 2.0 / units
        i += 1
    for j, at in enumerate(wide_at):
        actions.append(
            Action(
                f"w{j}", {"cpu": [units]}, duration=rng.uniform(0.5, 3), kind="wide", submit_time=at
            )
        )
    policy = get_allocator("backfill", order=order, aging=2.0)
    result = _run(
        {"cpu": FlatPool("cpu", {"n0": units})},
        actions,
        policy,
        {"small": small_factor, "wide": wide_factor},
    )
    for j, at in enumerate(wide_at):
        assert result.records[f"w{j}"].start < 150, (j, at, result.records[f"w{j}"])


def test_a_wrong_estimate_delays_the_reserved_action_but_does_not_starve_it():
    """x holds 1 of 2 cores for 4 s; w needs both and is reserved from 4. b (1 core) is
    estimated at 2 s, so it backfills beside w's reservation; it really runs 6 s, so w starts
    at 6 instead of 4 (a delay). With b's estimate right (6 s) it would not have backfilled."""

    def actions(b_true):
        return [
            Action("x", {"cpu": [1]}, duration=4, kind="x"),
            Action("w", {"cpu": [2]}, duration=1, kind="w"),
            Action("b", {"cpu": [1]}, duration=b_true, kind="b"),
        ]

    pools = lambda: {"cpu": FlatPool("cpu", {"n0": 2})}
    wrong = _run(pools(), actions(6.0), BackfillAllocator(), {"b": 2 / 6})
    assert wrong.records["b"].start == 0 and wrong.records["w"].start == 6
    right = _run(pools(), actions(6.0), BackfillAllocator(), {})
    assert right.records["w"].start == 4 and right.records["b"].start == 5
    exact = _run(pools(), actions(2.0), BackfillAllocator(), {})
    assert exact.records["b"].start == 0 and exact.records["w"].start == 4
