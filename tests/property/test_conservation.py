"""Work conservation (docs/architecture.md section 6, `tangram.conservation`): every runtime
policy found through the registry, alone (the scheduler's rule off), never leaves an action
waiting while every amount it allows is free and nothing ahead of it on its pools is blocked;
with the rule on, no policy at all does. Fresh hypothesis examples every run; the
counterexamples found so far are kept as `@example`s and scenario files
(`tests/scenarios/conservation_*.json`)."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import pytest
from grammar import instance_docs
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evaluation.replay import check_result, main
from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.minimal import MinAllocator
from solvers.registry import register, runtime_policies
from tangram.actions import Action, Elasticity
from tangram.allocation import Assignment, ClusterView, IdleByDesign
from tangram.conservation import check_schedule, wasted_now
from tangram.instance import Instance, load_instance, parse_instance
from tangram.pools import FlatPool
from tangram.results import ScheduledAction

SCEN = Path(__file__).parents[1] / "scenarios"
KEPT = sorted(SCEN.glob("conservation_*.json"))
POLICIES = runtime_policies()  # heuristic, backfill, backfill-srpt, min, cpsat, pulp, ...
# the receding-horizon exact policies: a solve per decision (small instances, few examples),
# and not work conserving alone, by design (conservation_exact_idles.json): only with the rule
EXACT = {"cpsat", "pulp"}
CONSERVING = [p for p in POLICIES if p not in EXACT]  # a new policy lands here untouched
EXAMPLES = 300  # fresh examples per policy in every run
EXACT_EXAMPLES = 10


def _kept(name: str) -> Instance:
    return load_instance(SCEN / name)


def docs(max_pools: int = 3, max_actions: int = 10):
    """The instance grammar (tests/grammar.py), without services: a deferral to a busy
    resident copy is a wait the schedule does not record (`tangram.conservation`)."""
    return instance_docs(max_pools, max_actions, services=False)


def _alone(doc: dict | Instance, policy: str):
    inst = doc if isinstance(doc, Instance) else parse_instance(doc)
    result = simulate(inst, get_allocator(policy), conserve=False)
    assert set(result.records) == {a.id for a in inst.actions}
    return check_result(inst, result)


def _kept_examples(test):
    for path in KEPT:
        test = example(inst=json.loads(path.read_text()))(test)
    return test


def test_the_registry_finds_the_policies_the_rule_speaks_of():
    assert {"heuristic", "backfill", "backfill-srpt", "min"} <= set(POLICIES)
    assert not {"k8s", "static", "serverless"} & set(POLICIES)  # baselines are not covered


@pytest.mark.parametrize("policy", CONSERVING)
def test_every_policy_alone_conserves_work_on_the_instance_grammar(policy):
    """Any pools of each topology, named nodes and node-bound actions, vector actions."""

    @settings(max_examples=EXAMPLES, deadline=None)
    @given(inst=docs())
    @_kept_examples
    def run(inst):
        report = _alone(inst, policy)
        assert not report, (report.intervals, json.dumps(inst))

    run()


@pytest.mark.parametrize("path", KEPT, ids=[p.stem for p in KEPT])
@pytest.mark.parametrize("policy", CONSERVING)
def test_the_kept_counterexamples_conserve_work(path, policy):
    assert not _alone(load_instance(path), policy)


@register("test-lazy")
class Lazy:
    """A policy that starts only every other action `min` would (a bad policy on purpose)."""

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        return MinAllocator().allocate(view, queue, now)[::2]


@settings(max_examples=80, deadline=None)
@given(
    inst=docs(),
    policy=st.sampled_from(["lazy", *CONSERVING]),
)
def test_the_scheduler_enforces_the_rule_whatever_the_policy(inst, policy):
    """With the rule on (the default), even a policy that leaves units idle on purpose
    leaves no action waiting beside free units it could use."""
    alloc = Lazy() if policy == "lazy" else get_allocator(policy)
    inst = parse_instance(inst)
    result = simulate(inst, alloc)
    assert not check_result(inst, result)


@pytest.mark.parametrize("policy", sorted(EXACT & set(POLICIES)))
def test_the_scheduler_enforces_the_rule_on_the_exact_policies(policy):
    @settings(max_examples=EXACT_EXAMPLES, deadline=None)
    @given(inst=docs(2, 4))
    @example(inst=json.loads((SCEN / "conservation_exact_idles.json").read_text()))
    def run(inst):
        inst = parse_instance(inst)
        assert not check_result(inst, simulate(inst, get_allocator(policy)))

    run()


def test_the_exact_policy_alone_idles_a_unit_where_the_optimum_does():
    """Why the exact policies are the exception: alone, cpsat keeps a1 waiting beside a free
    unit (0.5 unit-seconds) and beats every shipped policy (8.5 against 9.5)."""
    inst = _kept("conservation_exact_idles.json")
    alone = simulate(inst, get_allocator("cpsat"), conserve=False)
    assert alone.total_act == pytest.approx(8.5)
    assert check_result(inst, alone).idle_unit_seconds == pytest.approx(0.5)
    assert simulate(inst, get_allocator("cpsat")).total_act == pytest.approx(9.5)


def test_the_rule_is_what_a_lazy_policy_breaks():
    """The checker is not vacuous: the lazy policy alone wastes units on the kept 3-core
    counterexample, and the scheduler's rule is what starts the rest."""
    inst = _kept("conservation_three_cores.json")
    alone = simulate(inst, Lazy(), conserve=False)
    report = check_result(inst, alone)
    assert report.actions == {"a2"} and report.idle_unit_seconds == pytest.approx(0.5)
    assert not check_result(inst, simulate(inst, Lazy()))


def test_check_schedule_finds_the_hand_worked_interval():
    """4 units; x holds 3 for 2 s; y (1 unit, 1 s) waits from 0 to 1 beside the free unit;
    z (3 units) from 1 to 2 only waits for units that are not free."""
    x = Action("x", {"cpu": 3}, duration=2.0)
    y = Action("y", {"cpu": 1}, duration=1.0)
    z = Action("z", {"cpu": 3}, duration=1.0, submit_time=1.0)
    pools = {"cpu": FlatPool("cpu", {"n0": 4})}
    at = pools["cpu"].copy().place(1)
    sched = [
        ScheduledAction(x, x.submit_time, 0.0, 2.0, {"cpu": 3}, {"cpu": at}),
        ScheduledAction(y, y.submit_time, 1.0, 2.0, {"cpu": 1}, {"cpu": at}),
        ScheduledAction(z, z.submit_time, 2.0, 3.0, {"cpu": 3}, {"cpu": at}),
    ]
    report = check_schedule(pools, sched)
    assert [(w.action_id, w.start, w.end) for w in report.intervals] == [("y", 0.0, 1.0)]
    assert report.idle_unit_seconds == pytest.approx(1.0)


def test_an_action_behind_a_blocked_one_may_wait_and_an_elastic_one_waits_for_more():
    """Strict FCFS: b (1 unit) behind a blocked a (3 units) is not wasting; an elastic e
    whose largest amount is not free waits for units that are not free."""
    pool = FlatPool("cpu", {"n0": 4})
    pool.place(2)
    a = Action("a", {"cpu": 3}, duration=1.0)
    b = Action("b", {"cpu": 1}, duration=1.0)
    e = Action("e", {"cpu": [1, 4]}, elasticity=Elasticity("cpu", 4.0, lambda m: 1.0))
    none = lambda act, r: None
    assert wasted_now({"cpu": pool}, [a, b], none) == []
    assert wasted_now({"cpu": pool}, [e], none) == []
    assert [w.action.id for w in wasted_now({"cpu": pool}, [b, a], none)] == ["b"]


def test_replay_check_exits_1_on_waste_and_prints_the_interval(capsys):

    path = str(SCEN / "conservation_three_cores.json")
    assert main([path, "--allocator", "heuristic", "--check", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["conservation"] == {"idle_unit_seconds": 0, "intervals": []}
    assert main([path, "--allocator", "test-lazy", "--check"]) == 0  # the scheduler's rule
    capsys.readouterr()
    assert main([path, "--allocator", "test-lazy", "--check", "--alone"]) == 1
    out = capsys.readouterr().out
    assert "a2 waited 0 to 0.5 while cpu=1" in out
    assert "idle unit-seconds while work waited: 0.5" in out


class LazyBaseline(Lazy, IdleByDesign):
    """The same lazy policy, declared as a baseline that keeps units idle by design."""


def test_a_baseline_that_idles_by_design_is_not_rescued():
    """The scheduler imposes no work conservation on an `IdleByDesign` policy (the
    evaluation's Kubernetes and static-GPU baselines model systems that idle units): its
    schedule keeps the waste the policy chose."""
    inst = _kept("conservation_three_cores.json")
    assert check_result(inst, simulate(inst, LazyBaseline())).actions == {"a2"}
    assert not check_result(inst, simulate(inst, Lazy()))
