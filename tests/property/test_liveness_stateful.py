"""Stateful liveness: random arrivals, completions, cancels and node bindings drive the real
scheduler (and, below, `Tangram.local()` on the sim backend). After every step the scheduler
runs a decision, as the runtime does after every event, and:

- if the queue is non-empty and nothing runs, that decision started something;
- no action waits longer than the documented bound (docs/architecture.md, "Liveness"): the
  serial run time, at their minimum units, of everything that ran or waited ahead of it when it
  arrived;
- at the end, with arrivals stopped, every action starts, and every unit is back;
- beside the cores, a GPU chunk pool and arrivals needing cores and a chunk at once: an action
  waiting for one pool holds nothing in the other (every property above holds for them);
- work conservation (`tangram.conservation`): with the scheduler's own rule off, the policy
  alone never leaves an action waiting while every amount it allows is free and nothing ahead
  of it is blocked.

It runs every runtime policy the registry finds (the receding-horizon exact ones aside: a solve
per step). The scheduler is global or scoped (docs/scale.md); both must keep every property.
"""

from __future__ import annotations

import asyncio

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from managers.cpu import CpuManager
from managers.cpu.backends.sim import SimCpuBackend
from managers.gpu import GB, GpuManager, Residency, Service, ServiceRegistry
from managers.gpu.sim import SimGpuBackend
from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram.actions import Action, Elasticity
from tangram.conservation import wasted_now
from tangram.errors import Infeasible
from tangram.pools import ChunkPool, CorePool
from tangram.profiles import amdahl
from tangram.runtime.facade import Tangram
from tangram.scheduler import Scheduler
from topology import ChunkTree, CpuNode

POLICIES = [p for p in runtime_policies() if p not in ("cpsat", "pulp")]
# shortest work first lets later arrivals go ahead (up to its aging bound), so the serial
# bound below is not its promise; `test_backfill.py` checks its own against a stream
REORDERS = {"backfill-srpt"}


class SchedulerMachine(RuleBasedStateMachine):
    @initialize(
        sizes=st.lists(st.integers(1, 4), min_size=1, max_size=2),
        policy=st.sampled_from(POLICIES),
        scoped=st.booleans(),
        gpus=st.sampled_from([0, 1, 2, 4]),
    )
    def setup(self, sizes: list[int], policy: str, scoped: bool, gpus: int) -> None:
        """`gpus` > 0: a chunk pool of one node beside the cores, and arrivals that need cores
        and a GPU chunk at once (vector actions)."""
        nodes = {f"n{i}": CpuNode(f"n{i}", {0: tuple(range(c))}) for i, c in enumerate(sizes)}
        self.pool = CorePool("cpu", nodes)
        self.capacity = self.pool.capacity()
        pools: dict = {"cpu": self.pool}
        if gpus:
            self.gpu_pool = pools["gpu"] = ChunkPool("gpu", {"g0": ChunkTree(gpus, "g0")})
        self.s = Scheduler(
            pools, get_allocator(policy), scoped=scoped, conserve=False
        )  # the policy alone must conserve work
        self.sizes = dict(zip(nodes, sizes))
        self.fcfs = policy not in REORDERS
        self.now = 0.0
        self.n = 0
        self.ends: dict[str, float] = {}  # running action -> its true end
        self.arrived: dict[str, float] = {}
        self.bound: dict[str, float] = {}  # action -> latest start the documented bound allows
        for i, n in enumerate(nodes):
            self.s.bind(f"t{i}", "cpu", n)

    def _serial_work(self) -> float:
        """Everything running or queued now, run one after another at minimum units."""
        total = sum(max(0.0, end - self.now) for end in self.ends.values())
        for a in self.s.queue:
            total += a.options[0][1] if a.options else a.duration
        return total

    spec = st.tuples(
        st.integers(1, 4),
        st.floats(0.05, 3.0),
        st.booleans(),
        st.integers(-1, 1),
        st.sampled_from([0, 0, 1, 2]),
    )

    @rule(burst=st.lists(spec, min_size=1, max_size=4))
    def submit(self, burst: list[tuple[int, float, bool, int, int]]) -> None:
        """One or more arrivals at this instant, then one decision (as the simulator does)."""
        for k, d, elastic, node, g in burst:
            self._submit_one(k, d, elastic, node, g)
        self._decide()

    def _submit_one(self, k: int, d: float, elastic: bool, node: int, g: int = 0) -> None:
        self.n += 1
        aid = f"a{self.n}"
        traj = f"t{node}" if 0 <= node < len(self.sizes) else None
        demands: dict = {"cpu": (1, k) if elastic else k}
        gpu = getattr(self, "gpu_pool", None)
        if g and gpu is not None:
            demands["gpu"] = min(g, gpu.capacity())  # cores and a GPU chunk together
        if elastic:
            act = Action(
                aid,
                demands,
                elasticity=Elasticity("cpu", d, amdahl(0.3)),
                submit_time=self.now,
                trajectory=traj,
            )
        else:
            act = Action(aid, demands, duration=d, submit_time=self.now, trajectory=traj)
        bound = self.now + self._serial_work()
        try:
            self.s.submit(act)
        except Infeasible:
            assert traj is not None and k > self.sizes[f"n{node}"] or k > max(self.sizes.values())
            return
        self.arrived[aid] = self.now
        self.bound[aid] = bound

    @precondition(lambda self: self.ends)
    @rule(data=st.data())
    def complete_next(self, data) -> None:
        aid = min(self.ends, key=self.ends.get)
        self.now = max(self.now, self.ends.pop(aid))
        self.s.complete(aid, self.now)
        self._decide()

    @precondition(lambda self: len(self.s.queue) > 0)
    @rule(data=st.data())
    def cancel(self, data) -> None:
        aid = data.draw(st.sampled_from(sorted(self.s.queue.keys())))
        assert self.s.cancel(aid)
        del self.bound[aid]
        self._decide()

    @rule(dt=st.floats(0.0, 1.0))
    def time_passes(self, dt: float) -> None:
        nxt = min(self.ends.values(), default=float("inf"))
        self.now = min(self.now + dt, nxt)
        self._decide()

    def _decide(self) -> None:
        for a in self.s.decide(self.now):
            aid = a.action.id
            self.ends[aid] = self.now + self.s.estimate(
                a.action, a.units.get(a.action.key) if a.action.key else None
            )
            bound = self.bound.pop(aid)
            assert not self.fcfs or self.now <= bound + 1e-6, (aid, self.now, bound)

    @invariant()
    def no_idle_strand(self) -> None:
        if hasattr(self, "s"):
            assert not (self.s.queue and not self.s.running), "queued work, nothing running"

    @invariant()
    def no_waste(self) -> None:
        if hasattr(self, "s"):
            s = self.s
            wasted = wasted_now(s.pools, list(s.queue), s.node_of, s.estimate)
            assert not wasted, [(w.action.id, dict(w.units)) for w in wasted]

    @invariant()
    def nobody_over_the_bound(self) -> None:
        if hasattr(self, "s") and self.fcfs:
            for aid in self.s.queue.keys():
                assert self.now <= self.bound[aid] + 1e-6, (aid, self.now, self.bound[aid])

    def teardown(self) -> None:
        if not hasattr(self, "s"):
            return
        for _ in range(10_000):
            if not self.ends:
                break
            self.complete_next(None)
        assert not self.s.queue and not self.s.running
        assert self.pool.free() == self.capacity
        gpu = getattr(self, "gpu_pool", None)
        assert gpu is None or gpu.free() == gpu.capacity()


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestScheduler = SchedulerMachine.TestCase


JUDGE = Service.uniform("judge", 30 * GB, (1, 2), restore_s=0.01, infer_s=0.01)


def sim_duration(command, cores: int) -> float:
    words = command.split() if isinstance(command, str) else list(command)
    return float(words[1]) / cores if words[:1] == ["sleep"] else 0.0


class RuntimeMachine(RuleBasedStateMachine):
    """`Tangram.local()`-style runtime on the sim backend, real asyncio, short sleeps."""

    @initialize(cores=st.integers(1, 4), gpus=st.sampled_from([0, 1, 2]))
    def setup(self, cores: int, gpus: int) -> None:
        """`gpus` > 0: a GPU manager (its `sim` backend, one service) beside the cores, and
        execs that need cores and a GPU chunk at once (vector actions) beside invokes."""
        self.loop = asyncio.new_event_loop()
        self.cores = cores
        self.gpus = gpus
        cpu = CpuManager(
            SimCpuBackend(sim_duration, time_scale=0.2),
            nodes={"n0": CpuNode("n0", {0: tuple(range(cores))})},
            memory_mb={"n0": 1 << 20},
        )
        gpu = None
        if gpus:
            registry = ServiceRegistry({"judge": JUDGE})
            gpu = GpuManager(
                ChunkPool("gpu", {"g0": ChunkTree(gpus, "g0")}),
                Residency.uniform({"g0": gpus}, 80 * GB, registry),
                SimGpuBackend(time_scale=0.2),
            )
        self.tg = Tangram(cpu=cpu, gpu=gpu)
        self.loop.run_until_complete(self.tg.start())
        self.envs: list[str] = []
        self.opened = 0
        self.calls: list[asyncio.Task] = []

    def _run(self, coro):
        return self.loop.run_until_complete(coro)

    @rule()
    def open_env(self) -> None:
        self.opened += 1
        self.envs.append(self._run(self.tg.open_env(f"t{self.opened}", 16)))

    @precondition(lambda self: self.envs)
    @rule(
        data=st.data(),
        k=st.integers(1, 4),
        s=st.sampled_from([0.0, 0.01, 0.05]),
        elastic=st.booleans(),
        g=st.sampled_from([0, 1, 1, 2]),
    )
    def exec(self, data, k: int, s: float, elastic: bool, g: int) -> None:
        env = data.draw(st.sampled_from(self.envs))
        k = min(k, self.cores)
        cpu = (1, k) if elastic else k
        gpus = min(g, self.gpus) or None  # cores and a chunk together where there is a GPU
        self.calls.append(
            self.loop.create_task(
                self.tg.exec(env, f"sleep {s}", cpu=cpu, elastic=elastic, timeout=30, gpus=gpus)
            )
        )
        self._run(asyncio.sleep(0))

    @precondition(lambda self: self.gpus)
    @rule(k=st.sampled_from([1, 2]))
    def invoke(self, k: int) -> None:
        """A service call on the same chunk pool: its copy is restored where no exec holds."""
        gpus = min(k, self.gpus)
        self.calls.append(self.loop.create_task(self.tg.invoke("judge", {"x": 1}, gpus=gpus)))
        self._run(asyncio.sleep(0))

    @precondition(lambda self: self.calls)
    @rule(data=st.data())
    def cancel_one(self, data) -> None:
        data.draw(st.sampled_from(self.calls)).cancel()
        self._run(asyncio.sleep(0))

    @precondition(lambda self: self.envs)
    @rule(data=st.data())
    def close_env(self, data) -> None:
        env = data.draw(st.sampled_from(self.envs))
        self.envs.remove(env)
        self._run(self.tg.close_env(env))

    @rule()
    def let_time_pass(self) -> None:
        self._run(asyncio.sleep(0.01))

    @invariant()
    def no_idle_strand(self) -> None:
        if hasattr(self, "tg"):
            sch = self.tg.scheduler
            assert not (sch.queue and not sch.running), "queued work, nothing running"

    async def _drained(self, limit: float) -> None:
        sch = self.tg.scheduler
        loop = asyncio.get_running_loop()
        until = loop.time() + limit
        while (sch.running or sch.queue) and loop.time() < until:
            await asyncio.sleep(0.005)
        assert not sch.running and not sch.queue, (list(sch.running), list(sch.queue.keys()))

    def teardown(self) -> None:
        if not hasattr(self, "tg"):
            return
        try:
            if self.calls:  # no caller hangs: all finish within a generous bound
                done, pending = self._run(asyncio.wait(self.calls, timeout=20))
                assert not pending, f"{len(pending)} callers still waiting"
            # a cancelled caller's action may still run: wait for every running one to end
            self._run(self._drained(20.0))
            assert self.tg.cpu.pool.free() == self.cores
            if self.gpus:
                assert self.tg.gpu.pool.free() == self.gpus
            self._run(self.tg.shutdown())
        finally:
            self.loop.close()


RuntimeMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
TestRuntime = RuntimeMachine.TestCase
