"""Regression tests for the liveness patterns of issue 13, on the scheduler with a manual
virtual clock (the runtime drives the same `Scheduler`)."""

from __future__ import annotations

import pytest

from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.errors import Infeasible, QueueFull
from tangram.pools import CorePool
from tangram.profiles import amdahl
from tangram.scheduler import Scheduler
from topology import CpuNode


def pool(**nodes: int) -> CorePool:
    return CorePool("cpu", {n: CpuNode(n, {0: tuple(range(c))}) for n, c in nodes.items()})


def elastic(aid: str, lo: int, hi: int, t_ori: float, t: float = 0.0, traj: str | None = None):
    return Action(
        aid,
        {"cpu": (lo, hi)},
        elasticity=Elasticity("cpu", t_ori, amdahl(0.25)),
        submit_time=t,
        trajectory=traj,
    )


def fixed(aid: str, k: int, d: float, t: float = 0.0, traj: str | None = None) -> Action:
    return Action(aid, {"cpu": k}, duration=d, submit_time=t, trajectory=traj)


def started(s: Scheduler, now: float) -> list[str]:
    return [a.action.id for a in s.decide(now)]


def test_idle_pool_starts_something_after_the_blocker_ends():
    """Pattern 1: greedy eviction put off every elastic candidate with nothing running."""
    s = Scheduler({"cpu": pool(n0=4)}, get_allocator("heuristic"))
    s.submit(fixed("blocker", 4, 5.0))
    assert started(s, 0.0) == ["blocker"]
    s.submit(elastic("A", 2, 4, 1.0, 0.1))
    s.submit(elastic("B", 1, 3, 3.0, 0.2))
    s.submit(fixed("C", 3, 1.0, 0.3))
    assert started(s, 0.3) == []
    s.complete("blocker", 5.0)
    assert started(s, 5.0), "4/4 cores free, three actions queued, nothing started"


def test_demand_larger_than_the_bound_node_is_refused_at_submit():
    """Pattern 2: admission checks the trajectory's node, not the largest node."""
    s = Scheduler({"cpu": pool(big=4, small=2)}, get_allocator("heuristic"))
    s.bind("t-small", "cpu", "small")
    with pytest.raises(Infeasible, match="small.*2"):
        s.submit(fixed("x", 3, 1.0, traj="t-small"))
    s.bind("t-other", "cpu", "small")
    s.submit(fixed("y", 1, 1.0, traj="t-other"))
    assert started(s, 0.0) == ["y"]


def test_elastic_action_is_not_overtaken_forever():
    """Pattern 3: a stream of 1-core actions must not keep an elastic action waiting."""
    s = Scheduler({"cpu": pool(n0=4)}, get_allocator("heuristic"))
    s.submit(fixed("busy", 1, 2.0))
    assert started(s, 0.0) == ["busy"]
    s.submit(elastic("E", 1, 4, 8.0, 0.01))
    running: dict[str, float] = {"busy": 2.0}
    e_start = None
    now = 0.01
    for i in range(200):
        now = 0.01 + 0.1 * i
        for aid, end in sorted(running.items(), key=lambda kv: kv[1]):
            if end <= now:
                s.complete(aid, end)
                del running[aid]
        s.submit(fixed(f"s{i}", 1, 0.15, now))
        for a in s.decide(now):
            if a.action.id == "E":
                e_start = now
            else:
                running[a.action.id] = now + 0.15
        if e_start is not None:
            break
    assert e_start is not None and e_start <= 2.5, e_start


def test_queue_bound_refuses_past_it():
    s = Scheduler({"cpu": pool(n0=1)}, get_allocator("min"), max_queue=3)
    for i in range(3):
        s.submit(fixed(f"a{i}", 1, 1.0))
    with pytest.raises(QueueFull, match="3"):
        s.submit(fixed("a3", 1, 1.0))


@pytest.mark.parametrize("policy", ["heuristic", "min"])
def test_multi_node_scan_skips_a_blocked_node_quickly(policy):
    """Pattern 5: actions bound to a busy node are skipped as a block, not one by one."""
    s = Scheduler({"cpu": pool(busy=1, idle=1)}, get_allocator(policy))
    s.bind("tb", "cpu", "busy")
    s.submit(fixed("hold", 1, 100.0, traj="tb"))
    assert started(s, 0.0) == ["hold"]
    for i in range(2000):
        s.submit(fixed(f"q{i}", 1, 1.0, traj="tb"))
    before = s.queue.visited
    assert started(s, 0.0) == []
    assert s.queue.visited - before <= 5, s.queue.visited - before


def test_multi_node_instance_binds_actions_and_the_exact_solver_agrees():
    from pathlib import Path

    from solvers.exact import solve_schedule
    from tangram.instance import load_instance, parse_instance

    inst = load_instance(Path(__file__).parents[1] / "scenarios" / "multi_node_bound.json")
    assert inst.bindings == {("s1", "cpu"): "small", ("s2", "cpu"): "small", ("b1", "cpu"): "big"}
    sched = solve_schedule(inst, time_limit=10)
    assert sched.total_act == pytest.approx(9.5)  # s2 (1 s) before s1 on the small node
    where = {e.action.id: e.placement["cpu"].node for e in sched.entries}
    assert where["s1"] == where["s2"] == "small" and where["b1"] == "big"
    doc = {
        "resources": {"cpu": {"topology": "flat", "nodes": {"big": 4, "small": 2}}},
        "actions": [{"id": "x", "node": "small", "demand": {"cpu": [3]}, "duration": 1}],
    }
    with pytest.raises(Infeasible, match="small"):
        parse_instance(doc)


def test_choose_cores_takes_the_ray_cpu_resource_domain_by_domain():
    from tangram.runtime.ray.agent import choose_cores

    numa = {0: (0, 1, 2, 3), 1: (4, 5, 6, 7)}
    assert choose_cores(numa, None) == numa
    assert choose_cores(numa, 2) == {0: (0, 1)}
    assert choose_cores(numa, 6) == {0: (0, 1, 2, 3), 1: (4, 5)}
    assert choose_cores(numa, 64) == numa


@pytest.mark.parametrize("how", ["cancel", "close"])
def test_cancelling_or_closing_a_queued_head_re_runs_the_decision(how):
    """Pattern 4: with 1 of 2 cores free, a 1-core action behind a queued 2-core head starts as
    soon as the head is cancelled (or its environment closed), not when the long action ends."""
    import asyncio

    from managers.cpu import CpuManager
    from managers.cpu.backends.sim import SimCpuBackend
    from tangram.runtime.facade import Tangram

    def seconds(command, cores):
        words = command.split()
        return float(words[1]) if words[0] == "sleep" else 0.0

    async def main():
        cpu = CpuManager(
            SimCpuBackend(seconds, time_scale=1.0),
            nodes={"n0": CpuNode("n0", {0: (0, 1)})},
            memory_mb={"n0": 4096},
        )
        # FCFS without backfilling, so the small action really waits behind the head
        async with Tangram(cpu=cpu, policy="heuristic") as tg:
            a, b, c = [await tg.open_env(f"t{i}", 64) for i in range(3)]
            long = asyncio.create_task(tg.exec(a, "sleep 3", cpu=1))
            await asyncio.sleep(0.05)
            head = asyncio.create_task(tg.exec(b, "sleep 0.1", cpu=2))
            await asyncio.sleep(0.05)
            small = asyncio.create_task(tg.exec(c, "sleep 0.1", cpu=1))
            await asyncio.sleep(0.05)
            assert len(tg.scheduler.queue) == 2  # the head waits, the small one behind it
            if how == "cancel":
                head.cancel()
            else:
                await tg.close_env(b)
            done, _ = await asyncio.wait({small, long}, return_when=asyncio.FIRST_COMPLETED)
            assert done == {small}, "the small action waited for the long one to end"
            assert (await small).ok
            await long
            if how == "close":
                assert (await head).status == "cancelled"

    asyncio.run(main())


class StartsNothing:
    """A policy that never starts anything: what is left is the scheduler's own rules."""

    def allocate(self, view, queue, now):
        return []


def test_liveness_rule_starts_the_first_that_fits_at_its_fastest_amount_on_an_idle_pool():
    """With the work-conservation rule off, only the liveness rule acts: nothing running and
    actions waiting -> the first that fits at its minimum starts, at its fastest amount that
    the free units hold; with anything running, it leaves the queue to the policy."""
    s = Scheduler({"cpu": pool(n0=4)}, StartsNothing(), conserve=False)
    s.submit(fixed("big", 5 - 1, 1.0))
    s.submit(elastic("e", 1, 4, 4.0))
    assert started(s, 0.0) == ["big"] and s.rescued == 1
    s.submit(fixed("small", 1, 1.0))
    assert started(s, 0.0) == [], "something runs: the liveness rule does not act"
    s.complete("big", 1.0)
    got = s.decide(1.0)
    assert [(a.action.id, a.units["cpu"]) for a in got] == [("e", 4)] and s.rescued == 2


def test_work_conservation_rule_starts_what_a_policy_leaves_beside_free_units():
    """The same policy with the rule on (the default): every queued action whose units are all
    free starts now, in queue order, at its fastest amount; one behind an action that does not
    fit waits (strict FCFS)."""
    s = Scheduler({"cpu": pool(n0=4)}, StartsNothing())
    s.submit(fixed("x", 1, 2.0))
    s.submit(elastic("e", 1, 2, 2.0))
    s.submit(fixed("wide", 4, 1.0))
    s.submit(fixed("y", 1, 1.0))
    got = s.decide(0.0)
    assert [(a.action.id, a.units["cpu"]) for a in got] == [("x", 1), ("e", 2)]
    # nothing ran: the liveness rule started x, the work-conservation rule e
    assert (s.rescued, s.conserved) == (1, 1) and list(s.queue.keys()) == ["wide", "y"]


def test_a_put_off_action_keeps_its_place():
    """6 cores; x holds 3 until 1. The elastic e (perfectly elastic, 8 s of work) is put off to
    wait for all 6 at 1 (ends at 2.33) instead of one core now (ends at 8). Of the 1-core
    candidates behind it, late (4 s) would still hold a core at 1 and push e back, so it waits;
    quick (0.5 s) ends before 1, so it takes a free core now."""
    s = Scheduler({"cpu": pool(n0=6)}, get_allocator("heuristic"), conserve=False)
    s.submit(fixed("x", 3, 1.0))
    assert started(s, 0.0) == ["x"]
    s.submit(
        Action(
            "e", {"cpu": (1, 6)}, elasticity=Elasticity("cpu", 8.0, lambda m: 1.0), submit_time=0.0
        )
    )
    s.submit(fixed("late", 1, 4.0))
    s.submit(fixed("quick", 1, 0.5))
    assert started(s, 0.0) == ["quick"]
    assert list(s.queue.keys()) == ["e", "late"]
    s.complete("quick", 0.5)
    assert started(s, 0.5) == []  # e's reservation still holds late back
    s.complete("x", 1.0)
    got = {a.action.id: a.units["cpu"] for a in s.decide(1.0)}
    assert got.get("e", 0) >= 5, got


def test_a_put_off_action_whose_units_are_free_now_starts_now():
    """The 3-core counterexample of issue 21 (tests/scenarios/conservation_three_cores.json):
    a1 (1 or 2 cores) beside two 1-core actions on 3 free cores starts now, beside them."""
    s = Scheduler({"cpu": pool(n0=3)}, get_allocator("heuristic"), conserve=False)
    s.submit(
        Action(
            "a1",
            {"cpu": (1, 2)},
            elasticity=Elasticity("cpu", 2.0, lambda m: {1: 1.0, 2: 0.769}[m]),
        )
    )
    s.submit(fixed("a2", 1, 1.0))
    s.submit(fixed("a3", 1, 0.5))
    assert sorted(started(s, 0.0)) == ["a1", "a2", "a3"]
