"""Decisions off the event loop (`tangram.runtime.decisions`): a slow policy decides in a worker
thread while the loop answers other clients; a fast one stays inline; the decision itself (the
policy's answer, then liveness and work conservation) is the same either way."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from solvers import get_allocator, register
from tangram.actions import Action
from tangram.allocation import SlowPolicy
from tangram.pools import ChunkPool, CorePool, FlatPool
from tangram.resources import Demand
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app
from tangram.scheduler import Scheduler
from topology import ChunkTree, CpuNode

GATE_S = 10.0  # a gated decision gives up waiting after this: an inline one then fails the test


@register("test-gated")
class Gated(SlowPolicy):
    """The heuristic's answer, given only once the test opens the gate: a solver that takes
    as long as the test wants, so the test can act while the decision runs."""

    entered = threading.Event()
    gate = threading.Event()
    log: list[str] = []

    def __init__(self) -> None:
        self.inner = get_allocator("heuristic")

    def allocate(self, view, queue, now):
        Gated.entered.set()
        Gated.gate.wait(GATE_S)
        Gated.log.append("decided")
        return self.inner.allocate(view, queue, now)


def _reset() -> None:
    Gated.entered.clear()
    Gated.gate.clear()
    Gated.log.clear()


def _tangram(policy: str) -> Tangram:
    cpu = CpuManager(
        SimCpuBackend(), nodes={"n0": CpuNode("n0", {0: (0, 1, 2, 3)})}, memory_mb={"n0": 8192}
    )
    return Tangram(cpu=cpu, policy=policy)


async def _entered() -> None:
    while not Gated.entered.is_set():
        await asyncio.sleep(0.005)


def test_a_slow_decision_leaves_status_and_other_clients_answered():
    _reset()
    tg = _tangram("test-gated")

    async def go():
        async with tg:
            env = await tg.open_env("t1")
            run = asyncio.create_task(tg.exec(env, "true", cpu=1))
            await _entered()  # the decision is running now
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(create_app(tg)), base_url="http://t"
            ) as http:
                st = (await http.get("/v1/status")).json()
            Gated.log.append("status")
            other = await tg.open_env("t2")  # another client's call
            Gated.log.append("open_env")
            Gated.gate.set()
            result = await run
            return st, other, result

    st, other, result = asyncio.run(go())
    assert Gated.log == ["status", "open_env", "decided"]
    assert st["queue"] == 1 and st["running"] == 0  # answered mid-decision
    assert other and result.status == "ok"
    assert tg._decisions.offloaded >= 1 and tg._decisions.inline == 0


def test_events_during_a_decision_coalesce_and_a_cancelled_action_never_starts():
    _reset()
    tg = _tangram("test-gated")

    async def go():
        async with tg:
            env = await tg.open_env("t1")
            first = asyncio.create_task(tg.exec(env, "true", cpu=1))
            await _entered()
            env2 = await tg.open_env("t2")
            second = asyncio.create_task(tg.exec(env2, "true", cpu=1))
            await asyncio.sleep(0)  # submitted while the first decision runs
            await tg.close_env(env)  # cancels `first`, which the running decision may start
            Gated.gate.set()
            return await first, await second

    first, second = asyncio.run(go())
    assert first.status == "cancelled" and second.status == "ok"
    # the second waited for the decision in flight (applied with the live state, or the
    # coalesced one right after it): nothing decided inline, nothing overlapped
    assert tg._decisions.inline == 0 and tg._decisions.offloaded >= 1


def test_a_fast_policy_decides_inline():
    tg = _tangram("heuristic")

    async def go():
        async with tg:
            env = await tg.open_env("t1")
            return [await tg.exec(env, "true", cpu=(1, 4), elastic=True) for _ in range(3)]

    results = asyncio.run(go())
    assert all(r.status == "ok" for r in results)
    assert tg._decisions.offloaded == 0 and tg._decisions.inline >= 3
    assert not tg._decisions.slow


def _actions(draw_sizes: list[tuple[int, int, float]]) -> list[Action]:
    out = []
    for i, (lo, hi, d) in enumerate(draw_sizes):
        out.append(
            Action(
                f"a{i}",
                {"cpu": Demand.range(lo, max(lo, hi)), "api": 1},
                duration=d,
                trajectory=f"t{i % 3}",
            )
        )
    return out


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 8), st.floats(0.1, 5.0)),
        min_size=1,
        max_size=12,
    ),
    policy=st.sampled_from(["heuristic", "backfill-srpt", "backfill", "min"]),
    rounds=st.integers(1, 4),
)
def test_a_prepared_decision_answers_what_decide_answers(sizes, policy, rounds):
    """The same events through `decide` and through `prepare`/`allocate`/`finish` give the
    same starts in the same order, round after round (completions in between)."""

    def scheduler() -> Scheduler:
        pools = {
            "cpu": CorePool(
                "cpu",
                {
                    "n0": CpuNode("n0", {0: (0, 1, 2, 3)}),
                    "n1": CpuNode("n1", {0: (0, 1, 2, 3, 4, 5)}),
                },
            ),
            "api": FlatPool("api", {"api": 3}),
        }
        s = Scheduler(pools, get_allocator(policy))
        for t, n in (("t0", "n0"), ("t1", "n1"), ("t2", "n0")):
            s.bind(t, "cpu", n)
        return s

    inline, split = scheduler(), scheduler()
    for a in _actions(sizes):
        inline.submit(a)
        split.submit(a)
    for r in range(rounds):
        now = float(r)
        got_inline = inline.decide(now)
        prepared = split.prepare(now)
        got_split = [] if prepared is None else split.finish(prepared, prepared.allocate(), now)
        assert [
            (a.action.id, dict(a.units), {k: (p.node, p.cores) for k, p in a.placement.items()})
            for a in got_inline
        ] == [
            (a.action.id, dict(a.units), {k: (p.node, p.cores) for k, p in a.placement.items()})
            for a in got_split
        ]
        assert (inline.rescued, inline.conserved) == (split.rescued, split.conserved)
        for s in (inline, split):  # the oldest running action finishes
            if s.running:
                s.complete(next(iter(s.running)), now + 0.5)


@register("test-sleepy")
class Sleepy:
    """Not marked slow, but each decision computes for 0.3 s of CPU: measured, it moves off
    the loop."""

    def __init__(self) -> None:
        self.inner = get_allocator("heuristic")

    def allocate(self, view, queue, now):
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.3:
            pass
        return self.inner.allocate(view, queue, now)


def test_a_policy_measured_slow_moves_off_the_loop():
    tg = _tangram("test-sleepy")

    async def go():
        async with tg:
            env = await tg.open_env("t1")
            first = await tg.exec(env, "true", cpu=1)  # decided inline, measured
            second = await tg.exec(env, "true", cpu=1)
            return first, second

    first, second = asyncio.run(go())
    assert first.status == second.status == "ok"
    assert tg._decisions.slow and tg._decisions.inline >= 1 and tg._decisions.offloaded >= 1


def test_the_exact_policy_decides_off_the_loop_end_to_end():
    """The real CP-SAT policy (`SlowPolicy`) through the runtime: every decision off the loop,
    every action served."""
    cpu = CpuManager(
        SimCpuBackend(), nodes={"n0": CpuNode("n0", {0: (0, 1, 2, 3)})}, memory_mb={"n0": 8192}
    )
    tg = Tangram(cpu=cpu, policy="cpsat", policy_options={"time_limit": 1.0})

    async def go():
        async with tg:
            envs = [await tg.open_env(f"t{i}") for i in range(3)]
            return await asyncio.gather(
                *(tg.exec(e, "true", cpu=(1, 2), elastic=True) for e in envs)
            )

    results = asyncio.run(go())
    assert all(r.status == "ok" for r in results), [r.detail for r in results]
    assert tg._decisions.inline == 0 and tg._decisions.offloaded >= 1


def test_a_placement_on_a_node_lost_during_the_decision_is_dropped_not_an_error():
    """A GPU node leaves the pool while the policy runs: its assignment is dropped, and the
    liveness rule starts the action on the node that is left (nothing else runs)."""
    pools = {"gpu": ChunkPool("gpu", {n: ChunkTree(2, n) for n in ("g0", "g1")})}
    s = Scheduler(pools, get_allocator("heuristic"))
    s.submit(Action("a", {"gpu": 2}, duration=1.0))
    prepared = s.prepare(0.0)
    answer = prepared.allocate()
    (chosen,) = [a.placement["gpu"].node for a in answer]
    pools["gpu"].retire(chosen)  # idle: it leaves the pool at once
    assert chosen not in pools["gpu"].nodes()
    started = s.finish(prepared, answer, 0.1)
    assert [a.placement["gpu"].node for a in started] == [n for n in ("g0", "g1") if n != chosen]
    assert s.rescued == 1 and "a" in s.running
