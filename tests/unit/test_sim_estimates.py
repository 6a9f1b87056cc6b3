"""The simulator's scheduler learns durations per kind (never sees the sampled truth) unless
`oracle`; the simulated API server counts 429s for whoever exceeds its limit."""

import dataclasses

from evaluation.closedloop import Policy, blind, run
from evaluation.experiments.common import tangram
from evaluation.flowcontrol import LearnedLimits, misconfigured
from evaluation.workloads import get_workload
from tangram.actions import Action, Elasticity
from tangram.pools import FlatPool
from tangram.profiles import DurationProfiles


def test_blind_action_carries_history_not_truth():
    prof = DurationProfiles(default=1.0)
    tool = Action("t", {"cpu": 1}, duration=7.0, kind="tool")
    assert blind(tool, prof, 3.0).duration is None
    assert prof.estimate(blind(tool, prof, 3.0)) == 1.0  # no history yet: the default
    prof.observe(tool, {"cpu": 1}, 2.0)
    prof.observe(tool, {"cpu": 1}, 4.0)
    assert prof.estimate(blind(tool, prof, 3.0)) == 3.0  # the kind's mean, not 7.0
    el = Elasticity("cpu", 50.0, {1: 1.0, 2: 0.5})
    rew = Action("r", {"cpu": [1, 2]}, elasticity=el, kind="reward")
    prof.observe(rew, {"cpu": 1}, 20.0)
    b = blind(rew, prof, 0.0)
    assert b.elasticity.t_ori == 20.0 and b.duration_at(1) == 20.0


def test_learned_and_oracle_runs_differ_and_both_finish():
    w = get_workload("coding", batch=12, nodes=1, cores_per_node=16, seed=2)
    learned = run(w, tangram())
    oracle = run(w, tangram(), oracle=True)
    assert len(learned.records) == len(oracle.records) == w.num_actions
    starts = lambda r: sorted((a, x.units["cpu"]) for a, x in r.records.items())
    assert starts(learned) != starts(oracle)


def test_api_server_counts_429_for_tangram_when_its_limit_is_exceeded():
    w = get_workload("deepsearch", batch=64, seed=1)
    assert run(w, tangram()).counters["api_429"] == 0  # configured at the server's limit
    limits = w.api_limits
    base = w.make_pools

    def too_many():  # Tangram misconfigured with four times the server's limit
        pools = base()
        for r, k in limits.items():
            pools[r] = FlatPool(r, {"node0": 4 * k})
        return pools

    over = dataclasses.replace(w, make_pools=too_many)
    assert run(over, Policy("tangram-over", tangram().allocator)).counters["api_429"] > 0


def test_a_tangram_told_a_wrong_limit_learns_it_from_the_servers_429s():
    w = get_workload("deepsearch", batch=64, seed=1)
    limits = w.api_limits
    over = misconfigured(w, 4)  # told four times the server's limit
    blind_run = run(over, Policy("tangram-4x", tangram().allocator))
    learner = LearnedLimits(tangram().allocator, {r: 4 * k for r, k in limits.items()})
    learned = run(over, Policy("tangram-4x-learning", learner, learner))
    assert sorted(learner.windows) == sorted(limits)
    assert 0 < learned.counters["api_429"] < blind_run.counters["api_429"] / 10
    for r, k in limits.items():  # it settled at the server's limit
        assert learner.windows[r].allowed(learned.makespan) <= k + 1
    # 429s thin out: probes above the learned limit, ever rarer; at most one in the second
    # half of the rollout
    assert learned.counters["api_429_late"] <= 1
