"""The scheduler sharded over processes (`tangram.runtime.shards`, docs/scale.md "Shards"):
routing, grants equal to an independent one-process run's (the golden cases and random
closed-loop workloads), and a shard that dies losing no queued action."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pickle
import signal
from pathlib import Path

import pytest
from grammar import instances
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evaluation.baselines.common import NoLifecycle
from evaluation.closedloop import ClosedLoopSimulator, EnvironmentStart, Policy
from evaluation.grant_recording import CASES, Recording, describe, granting
from evaluation.shardcheck import compare
from evaluation.workloads import get_workload
from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.allocation import Assignment, RunningAction
from tangram.errors import InvariantError, ValidationError
from tangram.pools import ChunkPool, CorePool, Placement
from tangram.resources import Demand
from tangram.results import Status
from tangram.runtime.facade import Tangram
from tangram.runtime.shards import ShardedScheduler, ShardLost, take_over, wire, wire_dumps
from tangram.runtime.shards.wire import (
    assignment,
    from_wire,
    grant_from_wire,
    grant_to_wire,
    running_action,
    to_wire,
)
from tangram.scheduler import Scheduler
from tangram.sharding import GLOBAL, ShardLayout
from topology import ChunkTree, CpuNode

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "decisions.json").read_text())


def cores(n: int, c: int) -> CorePool:
    return CorePool("cpu", {f"n{i}": CpuNode.flat(f"n{i}", c) for i in range(n)})


def fixed(aid: str, k: int, traj: str, d: float = 1.0) -> Action:
    return Action(aid, {"cpu": k}, duration=d, trajectory=traj)


# -- routing (the pure layer) -----------------------------------------------------------------
def test_contiguous_layout_and_routes():
    lay = ShardLayout.contiguous(["cpu"], [f"n{i}" for i in range(5)], 2)
    assert lay.groups == (("n0", "n1", "n2"), ("n3", "n4"))
    bound = {("t", "cpu"): "n3"}
    assert lay.route(fixed("a", 1, "t"), bound) == 1
    assert lay.route(fixed("b", 1, "u"), bound) is None  # not bound yet: the router binds it
    assert lay.route(Action("g", {"gpu": 1}, duration=1.0), bound) == GLOBAL
    with pytest.raises(ValidationError, match="cannot go with the rest"):
        lay.route(Action("m", {"cpu": 1, "gpu": 1}, duration=1.0, trajectory="t"), bound)
    with pytest.raises(ValidationError, match="shards"):
        ShardLayout.contiguous(["cpu"], ["n0"], 2)


@pytest.mark.parametrize(
    "efficiency", [{1: 1, 2: 0.9, 4: 0.7}, lambda m: {1: 1, 2: 0.9, 4: 0.7}[m]]
)
def test_actions_cross_the_pipe_whole_but_their_payload(efficiency):
    a = Action(
        "r",
        {"cpu": [1, 2, 4]},
        elasticity=Elasticity("cpu", 3.0, efficiency),
        trajectory="t",
        kind="reward",
        submit_time=2.5,
        payload=object(),
    )
    b = pickle.loads(wire_dumps(a))
    assert b.payload is None  # a shard decides; the router keeps what runs
    assert (b.id, b.trajectory, b.kind, b.submit_time, dict(b.mins)) == (
        "r",
        "t",
        "reward",
        2.5,
        {"cpu": 1},
    )
    assert b.options == a.options and b.duration_at(4) == a.duration_at(4)
    assert (b.elasticity.key, b.elasticity.t_ori) == ("cpu", 3.0)
    assert list(b.option_arrays[0]) == [1, 2, 4] and dict(b.elasticity.efficiency) == {
        1: 1,
        2: 0.9,
        4: 0.7,
    }


def _as_arrival(a: Action) -> Action:
    """`a` as a shard rebuilds it from the router's op stream (`to_wire`, pickled, `from_wire`
    where it crossed flat), with no demand seen before (the shared mappings built anew)."""
    wire._PROXIES.clear()
    got = pickle.loads(wire_dumps([to_wire(a)]))[0]
    return from_wire(got) if type(got) is tuple else got


def test_a_plain_arrival_crosses_the_op_stream_with_every_field():
    """Every field set (the instance grammar may draw None for the optional ones), twice: the
    second time through the demands shared with the first."""
    a = Action(
        "a1",
        {"cpu": [2, 4]},
        duration=3.5,
        trajectory="traj-7",
        task="task-3",
        kind="tool",
        service="svc",
        submit_time=12.25,
        timeout=9.0,
        payload=object(),
    )
    for shared in (False, True):
        t = to_wire(a)
        assert type(t) is tuple
        b = from_wire(pickle.loads(wire_dumps(t))) if shared else _as_arrival(a)
        for f in dataclasses.fields(Action):
            want = None if f.name == "payload" else getattr(a, f.name)
            assert getattr(b, f.name) == want, f.name
        assert type(b.demands["cpu"]) is Demand and b.demands["cpu"].amounts == (2, 4)
    with pytest.raises(TypeError):  # read-only, as an action's own
        b.demands["cpu"] = None  # type: ignore[index]


def test_the_shared_demands_a_shard_keeps_are_bounded():
    """Users choose the demands: past `PROXIES_MAX` distinct ones the shared mappings are
    dropped and built anew, and every action still crosses with its own demand."""
    wire._PROXIES.clear()
    for n in range(wire.PROXIES_MAX + 10):
        a = Action(f"a{n}", {"cpu": [1, 2 + n]}, duration=1.0, trajectory="t")
        b = from_wire(to_wire(a))
        assert b.demands["cpu"].amounts == (1, 2 + n) and dict(b.mins) == {"cpu": 1}
        assert len(wire._PROXIES) <= wire.PROXIES_MAX


@settings(max_examples=60, deadline=None)
@given(inst=instances(max_actions=6))
@pytest.mark.parametrize("cross", [lambda a: pickle.loads(wire_dumps(a)), _as_arrival])
def test_every_action_the_instance_grammar_allows_crosses_the_pipe_whole(cross, inst):
    """Every field but the payload, for every action an instance file may hold (elastic or
    not, one resource or several, timeouts, services): the plain path and the general one, as
    a shard's start or a replacement's queue carries it (pickled) and in the op stream."""
    for a in inst.actions:
        b = cross(a)
        assert type(b) is Action
        for f in dataclasses.fields(Action):
            if f.name in ("payload", "option_arrays", "elasticity"):
                continue
            assert getattr(b, f.name) == getattr(a, f.name), f.name
        assert b.payload is None and b.key == a.key and b.is_elastic == a.is_elastic
        if a.elasticity is not None:  # E(m) as its table over the allowed amounts, T_ori as is
            el, got = a.elasticity, b.elasticity
            assert (got.key, got.t_ori) == (el.key, el.t_ori)
            amounts = a.demands[el.key].amounts
            assert [got.e(m) for m in amounts] == [el.e(m) for m in amounts]
            assert [b.duration_at(m) for m in amounts] == [a.duration_at(m) for m in amounts]
        assert b.duration_at() == a.duration_at()
        if a.option_arrays is None:
            assert b.option_arrays is None
        else:
            assert [list(x) for x in b.option_arrays] == [list(x) for x in a.option_arrays]


_placements = st.builds(
    Placement,
    st.sampled_from(["n0", "cpu12", "gpu-node-3"]),
    st.lists(st.integers(0, 255), max_size=8, unique=True).map(tuple),
    st.none() | st.tuples(st.integers(0, 7), st.sampled_from([1, 2, 4, 8])),
)


@settings(max_examples=60, deadline=None)
@given(inst=instances(max_actions=6), data=st.data())
def test_every_grant_the_instance_grammar_allows_crosses_the_pipe_whole(inst, data):
    """A grant of every action an instance file may hold, on one resource or several, reaches
    the router with the units and placements the shard granted, and the router's assignment
    and running action equal the ones their constructors make."""
    for act in inst.actions:
        units = {r: data.draw(st.sampled_from(d.amounts)) for r, d in act.demands.items()}
        placement = {r: data.draw(_placements) for r in units}
        g = pickle.loads(wire_dumps(grant_to_wire(Assignment(act, units, placement))))
        aid, got_units, got_placement = grant_from_wire(g)
        assert (aid, got_units, got_placement) == (act.id, units, placement)
        assert all(type(p) is Placement for p in got_placement.values())
        a = assignment(act, got_units, got_placement)
        assert (a.action, a.units, a.placement) == (act, units, placement)
        ra = running_action(a, 1.5, 4.0)
        assert (ra.assignment, ra.start, ra.expected_end) == (a, 1.5, 4.0)
        assert type(a) is Assignment and type(ra) is RunningAction


# -- the same grants ----------------------------------------------------------------------------
class Logged(Scheduler):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.log: list[str] = []

    def decide(self, now):
        out = super().decide(now)
        if out:
            self.log.append(f"{now:.9g} " + " ".join(describe(a) for a in out))
        return out


@pytest.mark.parametrize("name", ["coding-heuristic", "mopd+search-heuristic"])
def test_one_shard_grants_what_the_golden_scheduler_grants(name):
    """With one node shard owning every node (and the GPU on the global shard) every grant,
    in order, is the single scheduler's; that scheduler's policy answers are the golden's."""
    _, drive = CASES[name]
    workload, params = {
        "coding-heuristic": ("coding", dict(batch=48, nodes=2, cores_per_node=8, seed=3)),
        "mopd+search-heuristic": ("mopd+search", dict(batch=24, gpu_nodes=1, seed=5)),
    }[name]
    rec = Recording(get_allocator("heuristic"))
    single = ClosedLoopSimulator(
        get_workload(workload, **params), Policy(workload, rec, scoped=True, make_scheduler=Logged)
    )
    single.run()
    assert granting(rec.lines) == granting(GOLDEN[name])

    class LoggedSharded(ShardedScheduler):
        log: list[str] = []

        def decide(self, now):
            out = super().decide(now)
            if out:
                self.log.append(f"{now:.9g} " + " ".join(describe(a) for a in out))
            return out

    make = functools.partial(LoggedSharded, shards=1)
    sharded = ClosedLoopSimulator(
        get_workload(workload, **params),
        Policy(workload, get_allocator("heuristic"), scoped=True, make_scheduler=make),
    )
    try:
        sharded.run()
    finally:
        sharded.scheduler.close()
    assert sharded.scheduler.log == single.scheduler.log


@pytest.mark.parametrize("lifecycle", [EnvironmentStart, NoLifecycle])
def test_grants_equal_on_an_uncontended_cluster(lifecycle):
    """Nodes with room for their trajectories (as in the scale bench): the same grants as an
    independent one-process run, decision by decision, for the whole run. With `NoLifecycle`
    no trajectory is bound when it begins: the router picks its first action's node (and
    shard) in one run, the scheduler in the other."""
    w = get_workload("coding", batch=40, nodes=4, cores_per_node=24, seed=2)
    c = compare(w, "heuristic", 4, lifecycle)
    assert c.first_difference is None, c.detail
    assert c.decisions > 500 and c.grants == w.num_actions


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    nodes=st.integers(2, 4),
    cores_per_node=st.sampled_from([8, 16, 32]),
    per_node=st.integers(2, 12),
    shards=st.integers(2, 4),
    seed=st.integers(0, 10_000),
    lifecycle=st.sampled_from([EnvironmentStart, NoLifecycle]),
)
@example(nodes=4, cores_per_node=16, per_node=16, shards=4, seed=1, lifecycle=EnvironmentStart)
@example(nodes=4, cores_per_node=16, per_node=16, shards=4, seed=1, lifecycle=NoLifecycle)
def test_grants_equal_until_the_single_scheduler_strands_a_shard(
    nodes, cores_per_node, per_node, shards, seed, lifecycle
):
    """On any closed-loop workload the router's grants equal an independent one-process run's
    (the plain scoped scheduler, same policy, same arrivals), decision by decision, up to
    where the single scheduler leaves a shard's nodes idle while actions bound there wait
    (its liveness rule is global; a shard's is per shard)."""
    shards = min(shards, nodes)
    c = compare(
        get_workload(
            "coding", batch=nodes * per_node, nodes=nodes, cores_per_node=cores_per_node, seed=seed
        ),
        "heuristic",
        shards,
        lifecycle,
    )
    assert c.first_difference is None or c.stranded, c.detail
    assert c.decisions > 0


# -- a shard that dies -----------------------------------------------------------------------
def _three_waiting(max_restarts: int) -> ShardedScheduler:
    s = ShardedScheduler(
        {"cpu": cores(2, 4)}, get_allocator("heuristic"), shards=2, max_restarts=max_restarts
    )
    s.bind("t", "cpu", "n1")
    for i in range(3):
        s.submit(fixed(f"a{i}", 4, "t"))
    assert [a.action.id for a in s.decide(0.0)] == ["a0"]
    assert s.state(1) == (["a1", "a2"], ["a0"])
    return s


def test_a_killed_shard_is_replaced_and_its_queue_resubmitted():
    with _three_waiting(max_restarts=1) as s:
        old = s.shard_pids()[1]
        os.kill(old, signal.SIGKILL)
        s.complete("a0", 1.0)
        assert [a.action.id for a in s.decide(1.0)] == ["a1"]
        assert s.restarts == [0, 1] and s.shard_pids()[1] != old
        assert s.state(1) == (["a2"], ["a1"])  # the replacement holds the running one too
        s.complete("a1", 2.0)
        assert [a.action.id for a in s.decide(2.0)] == ["a2"]
        assert not s.failed


def test_a_shard_that_cannot_be_replaced_fails_its_queue_naming_it():
    with _three_waiting(max_restarts=0) as s:
        os.kill(s.shard_pids()[1], signal.SIGKILL)
        s.complete("a0", 1.0)
        assert s.decide(1.0) == []
        assert set(s.failed) == {"a1", "a2"}
        assert "shard 1 (node n1)" in str(s.failed["a1"])
        assert not s.queue
        with pytest.raises(ShardLost, match="shard 1"):
            s.submit(fixed("late", 1, "t"))
        s.bind("u", "cpu", "n0")  # the other shard still serves
        s.submit(fixed("b", 1, "u"))
        assert [a.action.id for a in s.decide(1.0)] == ["b"]


def test_a_closed_loop_run_survives_a_killed_shard():
    """Mid-run, a shard is SIGKILLed: every action still runs exactly once."""
    w = get_workload("coding", batch=32, nodes=4, cores_per_node=8, seed=7)
    sim = ClosedLoopSimulator(
        w,
        Policy(
            "coding",
            get_allocator("heuristic"),
            scoped=True,
            make_scheduler=functools.partial(ShardedScheduler, shards=2),
        ),
    )
    killed = []

    def kill_once(sched, _cpu):
        if sched.decisions == 300 and not killed:
            killed.append(sched.shard_pids()[0])
            os.kill(killed[0], signal.SIGKILL)

    sim.on_decision = kill_once
    try:
        r = sim.run()
    finally:
        sim.scheduler.close()
    assert killed and sim.scheduler.restarts[0] == 1
    assert len(r.records) == w.num_actions


def test_a_pooled_resource_stays_on_the_global_shard():
    pools = {"cpu": cores(2, 2), "gpu": ChunkPool("gpu", {"g0": ChunkTree(8)})}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=2) as s:
        s.submit(Action("j", {"gpu": [1, 2]}, duration=1.0, trajectory="t"))
        s.submit(fixed("c", 1, "t"))
        got = {a.action.id: a.placement for a in s.decide(0.0)}
        assert set(got) == {"j", "c"} and got["j"]["gpu"].node == "g0"
        assert s.bindings[("t", "cpu")] == got["c"]["cpu"].node == "n0"


def test_a_bound_trajectorys_actions_route_by_resource_and_by_its_current_binding():
    """A trajectory's CPU actions go to its node's shard, an action of the same trajectory on
    a pooled resource to the global shard; after an unbind its next action is placed (and
    bound) again, and after a bind elsewhere it goes to that node's shard."""
    pools = {"cpu": cores(2, 2), "gpu": ChunkPool("gpu", {"g0": ChunkTree(8)})}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=2) as s:
        s.submit(fixed("c", 1, "t"))
        (first,) = s.decide(0.0)
        s.submit(fixed("c2", 1, "t"))  # routed to the bound node's shard
        s.submit(Action("j", {"gpu": [1, 2]}, duration=1.0, trajectory="t"))
        got = {a.action.id: a.placement for a in s.decide(1.0)}
        assert got["j"]["gpu"].node == "g0"
        assert got["c2"]["cpu"].node == first.placement["cpu"].node
        s.complete("c", 2.0)
        s.complete("c2", 2.0)
        s.unbind("t")  # its next action is placed, and bound, again
        s.submit(fixed("c3", 1, "t"))
        (c3,) = s.decide(3.0)
        assert s.bindings.get(("t", "cpu")) == c3.placement["cpu"].node
        s.submit(fixed("c3b", 1, "t"))  # routed by its new binding
        assert s.decide(3.5)[0].placement["cpu"].node == c3.placement["cpu"].node
        s.complete("c3", 4.0)
        s.complete("c3b", 4.0)
        other = "n1" if c3.placement["cpu"].node == "n0" else "n0"
        s.bind("t", "cpu", other)  # a new node: its shard
        s.submit(fixed("c4", 1, "t"))
        (c4,) = s.decide(5.0)
        assert c4.placement["cpu"].node == other


def test_a_first_action_is_placed_behind_what_the_shards_already_queue():
    """An unbound first action is placed as one scheduler's FCFS scan would place it, behind
    the actions its shards queue and have not decided yet: n0 has the most free cores, but an
    earlier action bound there takes both, so the first action goes to n1's free core."""
    grants = []
    for make in (Scheduler, functools.partial(ShardedScheduler, shards=2)):
        pools = {"cpu": cores(2, 2)}
        s = make(pools, get_allocator("heuristic"))
        try:
            s.bind("r", "cpu", "n1")
            s.submit(fixed("busy", 1, "r"))
            assert [a.action.id for a in s.decide(0.0)] == ["busy"]  # n1: 1 core free
            s.bind("b", "cpu", "n0")
            s.submit(fixed("big", 2, "b"))  # bound to n0, not decided yet
            s.submit(fixed("first", 1, "u"))  # unbound: placed at the decision
            grants.append({a.action.id: a.placement["cpu"].node for a in s.decide(1.0)})
        finally:
            getattr(s, "close", lambda: None)()
    assert grants[0] == grants[1] == {"big": "n0", "first": "n1"}


def test_actions_behind_an_unplaced_first_action_wait_on_the_cores_only():
    """While a trajectory's first CPU action waits for a node, a later CPU action of a bound
    trajectory waits behind it (FCFS on the cores, as one scheduler: it takes n0's only core
    first); a pooled action does not wait, and a waiting action can be cancelled."""
    pools = {"cpu": cores(1, 1), "gpu": ChunkPool("gpu", {"g0": ChunkTree(8)})}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=1) as s:
        s.bind("t", "cpu", "n0")
        s.submit(fixed("first", 1, "u"))  # unbound: waits for a node
        s.submit(fixed("later", 1, "t"))  # bound to n0, but behind it
        s.submit(Action("g", {"gpu": 2}, duration=1.0, trajectory="t"))
        s.submit(fixed("gone", 1, "t"))
        assert s.cancel("gone") and "gone" not in s.queue
        assert sorted(a.action.id for a in s.decide(0.0)) == ["first", "g"]
        assert s.bindings[("u", "cpu")] == "n0" and "later" in s.queue


@pytest.mark.parametrize("pooled", [False, True])
def test_the_router_learns_by_the_one_rule_from_its_run_time(pooled):
    """A completion teaches its kind's mean from the run time it reports (else from its start),
    by the one learning rule (a failed run teaches nothing), on a node shard's action and on a
    pooled one alike; a mean learned inside a batch is noted at the next instant."""
    pools = {"cpu": cores(1, 2), "gpu": ChunkPool("gpu", {"g0": ChunkTree(8)})}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=1, batched=True) as s:

        def start(aid, at):
            r = "gpu" if pooled else "cpu"
            s.submit(Action(aid, {r: 1}, duration=9.0, trajectory="t", kind="k"))
            s.decide(at)
            s.collect()

        s.bind("t", "cpu", "n0")
        start("a", 0.0)
        s.complete("a", 7.0, run_s=5.0)
        assert s.profiles.mean("k") == 5.0
        start("b", 7.0)
        s.complete("b", 8.0, status=Status.FAILED)  # a failed run teaches nothing
        assert s.profiles.mean("k") == 5.0
        start("c", 8.0)
        s.complete("c", 11.0)  # no run time given: from its start
        assert s.profiles.mean("k") == 4.0
        start("d", 11.0)
        s.submit(fixed("x", 1, "t"))
        s.decide(11.5)  # a batch is open: a mean learned now is a change before its next instant
        ra = s.complete("d", 12.0, status=Status.TIMEOUT)  # killed at its timeout: learned
        assert ra.assignment.action.id == "d" and s.profiles.mean("k") == 3.0
        assert s._batch.changes.triples() == [(1, "k", 3.0)]


def test_a_logged_batched_decision_holds_the_global_shards_grants_too():
    """The stream `compare` reads: each decision's grants, the pooled ones decided at once and
    the node shards' answered later, at the instant they were made."""
    pools = {"cpu": cores(1, 2), "gpu": ChunkPool("gpu", {"g0": ChunkTree(8)})}
    with ShardedScheduler(
        pools, get_allocator("heuristic"), shards=1, batched=True, log_stream=True
    ) as s:
        s.bind("t", "cpu", "n0")
        s.submit(fixed("c", 1, "t"))
        s.submit(Action("g", {"gpu": 2}, duration=1.0, trajectory="t"))
        assert [a.action.id for a in s.decide(0.5)] == ["g"]
        s.collect()
        ((_, at, grants),) = s.stream
        assert at == 0.5 and sorted(a.action.id for a in grants) == ["c", "g"]


def test_a_shard_whose_put_off_class_is_due_is_asked_at_that_instant():
    """Per instant: the elastic e is put off on n0's shard to wait for x's 3 cores (x's
    estimated end, 1.0); events on n1's shard alone do not ask n0's, and at 1.0 (an event on
    n1 only) the router asks n0's shard, due then, and e starts, as in one scheduler."""
    pools = {"cpu": CorePool("cpu", {n: CpuNode.flat(n, c) for n, c in (("n0", 6), ("n1", 1))})}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=2) as s:
        for t, n in (("ta", "n0"), ("tb", "n1")):
            s.bind(t, "cpu", n)
        s.submit(fixed("x", 3, "ta"))
        assert [a.action.id for a in s.decide(0.0)] == ["x"]
        e = Elasticity("cpu", 8.0, lambda m: 1.0)
        s.submit(Action("e", {"cpu": (1, 6)}, elasticity=e, trajectory="ta"))
        assert s.decide(0.0) == [] and "e" in s.queue  # put off until 1.0
        for i, now in enumerate((0.2, 0.5, 0.9)):
            s.submit(fixed(f"b{i}", 1, "tb", d=0.1))
            assert [a.action.id for a in s.decide(now)] == [f"b{i}"]
            s.complete(f"b{i}", now + 0.1)
        s.submit(fixed("b9", 1, "tb", d=0.1))
        assert {a.action.id for a in s.decide(1.0)} == {"e", "b9"}


def test_a_batch_carries_the_means_at_its_first_instant_and_each_change_after():
    """The open batch's means: those learned before its first instant as its base (a kind
    learned between two batches included), then each change at the instant it was learned
    by; a kind learned nothing is not sent."""
    pools = {"cpu": cores(2, 2)}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=2, batched=True) as s:
        s.submit(Action("a", {"cpu": 1}, trajectory="t", kind="tool"))
        s.decide(0.0)
        s.collect()
        s.complete("a", 2.0)  # learned between two batches: 2 s
        s.submit(Action("b", {"cpu": 1}, trajectory="t", kind="tool"))
        s.decide(2.0)
        b = s._batch
        assert b.base == {"tool": 2.0} and b.changes.triples() == []
        s.submit(Action("c", {"cpu": 1}, trajectory="t", kind="other"))
        s.decide(2.5)  # nothing learned since the first instant: no change
        s.settle()  # the grants of b and c
        s.complete("b", 6.0)  # 4 s: the mean of tool moves to 3 s
        s.submit(Action("d", {"cpu": 1}, trajectory="t", kind="tool"))
        s.decide(6.0)
        assert s._batch.base == {"tool": 3.0}  # a new batch: its base, no change yet
        s.complete("c", 7.0)
        s.submit(Action("e", {"cpu": 1}, trajectory="t", kind="tool"))
        s.decide(7.0)
        assert s._batch.changes.triples() == [(1, "other", 4.5)]


@pytest.mark.parametrize("batched", [False, True])
def test_a_grant_is_running_from_its_instant_with_its_estimated_end(batched):
    """Per instant a grant is taken in the router's mirror at once; batched, when something
    reads the mirror (`sync_pools`). Either way `running` holds it from the instant it was
    granted, expected to end at that instant plus its estimate."""
    pools = {"cpu": cores(2, 2)}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=2, batched=batched) as s:
        s.bind("t", "cpu", "n1")
        s.submit(fixed("a", 2, "t", d=3.0))
        got = s.decide(1.0)
        if batched:
            assert got == [] and pools["cpu"].free("n1") == 2  # answered later
            ((_, at, got),) = s.collect()
            assert at == 1.0 and pools["cpu"].free("n1") == 2  # not read yet: not taken
            s.sync_pools()
        assert [a.action.id for a in got] == ["a"]
        assert pools["cpu"].free("n1") == 0  # the mirror holds both cores
        ra = s.running["a"]
        assert ra.start == 1.0 and ra.expected_end == 1.0 + s.estimate(ra.assignment.action)
        s.complete("a", 4.0)
        assert pools["cpu"].free("n1") == 2 and "a" not in s.running


def test_a_shard_granting_what_it_does_not_hold_or_a_core_taken_is_refused_naming_it():
    """The router's checks on a shard's answer (white-box: a healthy shard never sends these):
    an action it was not sent, a core the mirror already holds."""
    pools = {"cpu": cores(2, 2)}
    with ShardedScheduler(pools, get_allocator("heuristic"), shards=2) as s:
        s.bind("t", "cpu", "n1")
        s.submit(fixed("a", 1, "t"))
        (a,) = s.decide(0.0)
        with pytest.raises(InvariantError, match=r"shard 1 started 'ghost', which it does not"):
            s._take(1, [("ghost", {"cpu": 1}, a.placement)], 0.5)
        s.submit(fixed("b", 1, "t"))
        with pytest.raises(InvariantError, match=r"shard 1: action b: cpu: "):
            s._take(1, [("b", {"cpu": 1}, a.placement)], 0.5)  # a's core, granted twice


def test_tangram_runs_on_shards_and_closes_them():
    """`Tangram(shards=2)`: environments on both nodes, execs granted by their node's shard,
    the shard processes gone after shutdown."""
    import asyncio

    from managers.cpu import CpuManager
    from managers.cpu.backends.sim import SimCpuBackend

    def duration(command, cores: int) -> float:
        return 0.01

    async def main():
        cpu = CpuManager(
            SimCpuBackend(duration, time_scale=1.0),
            nodes={n: CpuNode.flat(n, 2) for n in ("n0", "n1")},
            memory_mb={"n0": 4096, "n1": 4096},
        )
        tg = Tangram(cpu=cpu, shards=2)
        await tg.start()
        pids = tg.scheduler.shard_pids()
        envs = [await tg.open_env(f"t{i}", 1024) for i in range(4)]
        results = await asyncio.gather(
            *(
                tg.exec(e, "true", cpu=(1, 2), elastic=True, timeout=10)
                for e in envs
                for _ in range(3)
            )
        )
        await tg.shutdown()
        return pids, results

    pids, results = asyncio.run(main())
    assert all(r.ok for r in results), [r.detail for r in results if not r.ok]
    assert {r.placement["cpu"].node for r in results} == {"n0", "n1"}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


# -- shards that continue a one-process scheduler (`take_over`, the scale bench's warm-up) ------
class _Switching:
    """One scoped `Scheduler` until decision `at`, then node shards continuing its state; logs
    every decision's grants (time, action, units, node, cores)."""

    def __init__(self, pools, allocator, *, at: int, kinds, scoped: bool = True) -> None:
        self.inner = Scheduler(pools, allocator, scoped=True)
        self.at, self.kinds, self.log = at, kinds, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def enqueue(self, action) -> None:
        self.inner.enqueue(action)

    def complete(self, *args, **kw):
        return self.inner.complete(*args, **kw)

    def decide(self, now: float):
        if self.inner.decisions == self.at and not isinstance(self.inner, ShardedScheduler):
            self.inner = take_over(self.inner, shards=4, kinds=self.kinds)
        out = self.inner.decide(now)
        self.log.append(
            (
                now,
                sorted(
                    (
                        a.action.id,
                        tuple(sorted(a.units.items())),
                        tuple((r, p.node, p.cores) for r, p in sorted(a.placement.items())),
                    )
                    for a in out
                ),
            )
        )
        return out


def test_shards_taking_over_mid_run_grant_what_one_process_grants():
    w = get_workload("coding", batch=40, nodes=4, cores_per_node=24, seed=2)
    kinds = {s.action.kind for t in w.trajectories for s in t.steps}
    runs = []
    for at in (-1, 200):  # never, and at the 200th decision (running and queued actions)
        make = functools.partial(_Switching, at=at, kinds=kinds)
        sim = ClosedLoopSimulator(
            w, Policy("heuristic", get_allocator("heuristic"), scoped=True, make_scheduler=make)
        )
        try:
            sim.run()
        finally:
            if isinstance(sim.scheduler.inner, ShardedScheduler):
                sim.scheduler.inner.close()
        runs.append(sim.scheduler)
    single, switched = runs
    assert isinstance(switched.inner, ShardedScheduler) and len(switched.log) > 400
    assert switched.log == single.log
