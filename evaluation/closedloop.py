"""Closed-loop, trajectory-driven simulation on the virtual clock.

A trajectory's next action arrives when its previous action has completed plus the LLM
generation time of the next turn, as in an agentic rollout (the open-loop `Simulator` replays
fixed arrival times instead). The real `Scheduler` makes every decision; only the policy and
its `Lifecycle` differ between Tangram and the baselines:

- `Lifecycle.start(traj, now)` is asked when a trajectory begins: it answers the delay until
  the trajectory's environment is ready (a container start, a pod start), or None when the
  environment cannot be created yet (no room for a pod); pending trajectories are asked again,
  first come first served, whenever a trajectory ends.
- `Lifecycle.end(traj, now)` when its last action completed (a pod's cores come back).
- `Lifecycle.wakeup(now)`: the next time the policy wants a decision even if nothing happens
  (a client's retry after a 429), or None.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from evaluation.engine import AFTER, Driver, Engine, Sharing, SimExecutor
from evaluation.upstream import ApiUpstream
from evaluation.workloads.base import Trajectory, Workload
from managers.cpu.environments import Environment, EnvironmentTable
from managers.gpu.sim import SimServiceModel
from tangram.actions import Action
from tangram.allocation import Allocator, Assignment
from tangram.errors import TangramError
from tangram.pools import CorePool, Pool
from tangram.profiles import DurationProfiles
from tangram.results import ScheduledAction
from tangram.scheduler import Scheduler

START, ARRIVAL = 1, 2  # the closed loop's events (completions come first: `Engine`)
REACTION = AFTER + ARRIVAL  # an arrival with no LLM gap: after the decision that freed it


class Lifecycle(Protocol):
    def attach(self, pools: Mapping[str, Pool], executors: Mapping[str, SimExecutor]) -> None: ...
    def start(self, traj: Trajectory, now: float) -> float | None: ...
    def nodes(self, traj: Trajectory, now: float) -> Mapping[str, str]:
        """Asked right after `start` accepted the trajectory: resource -> the node its
        environment opens on, bound for its life. A resource not named is bound where the
        trajectory's first action of it is placed (a baseline that places its own pods)."""
        ...

    def end(self, traj: Trajectory, now: float) -> None: ...
    def wakeup(self, now: float) -> float | None: ...


ENV_MEMORY_MB = 1024  # what `Tangram.open_env` reserves by default
NODE_MEMORY_MB = 1 << 40  # the simulated nodes' memory: never binds, so the load ranks alone


@dataclass
class EnvironmentStart:
    """Tangram's lifecycle: one container per trajectory holding no cores (memory only, which
    is assumed never to bind), started in `start_s` (docs/calibration.md §2: 0.5 s), on the
    node the runtime would open it on: the CPU manager's own rule
    (`managers.cpu.environments.EnvironmentTable.choose_node`: memory load, then free cores, at the
    moment the trajectory begins)."""

    start_s: float = 0.5
    _tables: dict[str, tuple[CorePool, EnvironmentTable]] = field(default_factory=dict, init=False)

    def attach(self, pools, executors) -> None:
        self._tables = {
            r: (p, EnvironmentTable({n: NODE_MEMORY_MB for n in p.nodes()}))
            for r, p in pools.items()
            if isinstance(p, CorePool)
        }

    def start(self, traj: Trajectory, now: float) -> float | None:
        return self.start_s

    def nodes(self, traj: Trajectory, now: float) -> dict[str, str]:
        out = {}
        for r, (pool, table) in self._tables.items():
            if any(r in s.action.demands for s in traj.steps):
                node = table.choose_node(pool, ENV_MEMORY_MB)
                table.add(Environment(traj.id, traj.id, node, ENV_MEMORY_MB, ""))
                out[r] = node
        return out

    def end(self, traj: Trajectory, now: float) -> None:
        for _, table in self._tables.values():
            if table.get(traj.id) is not None:
                table.remove(traj.id)

    def wakeup(self, now: float) -> float | None:
        return None


@dataclass
class Policy:
    """An allocator and the lifecycle it needs; `executors` builds the managers' time models
    (GPU restores) for a workload, `None` meaning the default service model."""

    name: str
    allocator: Allocator
    lifecycle: Lifecycle = field(default_factory=EnvironmentStart)
    executors: Callable[[Workload], dict[str, SimExecutor]] | None = None
    scoped: bool = False  # `Scheduler(scoped=True)`: decide only what an event touched
    make_scheduler: Callable[..., Scheduler] = Scheduler  # or one with `Scheduler`'s methods


@dataclass
class LoopResult:
    records: dict[str, ScheduledAction]
    kinds: dict[str, tuple[str, str, str]]  # action id -> (trajectory, task, kind)
    setups: dict[str, tuple[float, float]]  # trajectory -> (begin, environment ready)
    spans: dict[str, tuple[float, float]]  # trajectory -> (begin, last action completed)
    counters: dict[str, float]
    decision_cpu_s: array = field(default_factory=lambda: array("d"))
    """CPU seconds (this thread) of each decision the scheduler made, in order."""

    def acts(self, kind: str | None = None, task: str | None = None) -> list[float]:
        out = []
        for aid, r in self.records.items():
            _, t, k = self.kinds[aid]
            if (kind is None or k == kind) and (task is None or t == task):
                out.append(r.end - r.arrival)
        return out

    def mean_act(self, kind: str | None = None, task: str | None = None) -> float:
        xs = self.acts(kind, task)
        return sum(xs) / len(xs) if xs else 0.0

    def per_trajectory(self, kind: str | None = None, task: str | None = None) -> float:
        """Mean over trajectories of the summed ACT of their actions (of `kind`)."""
        trajs = {tr for tr, t, _ in self.kinds.values() if task is None or t == task}
        return sum(self.acts(kind, task)) / max(1, len(trajs))

    def mean_setup(self) -> float:
        return sum(b - a for a, b in self.setups.values()) / max(1, len(self.setups))

    @property
    def makespan(self) -> float:
        return max((e for _, e in self.spans.values()), default=0.0)

    def active_share(self) -> float:
        """Mean over trajectories of (time an action of it runs) / (its life)."""
        busy: dict[str, float] = {}
        for aid, r in self.records.items():
            tr = self.kinds[aid][0]
            busy[tr] = busy.get(tr, 0.0) + r.end - r.start
        shares = [busy.get(t, 0.0) / (e - s) for t, (s, e) in self.spans.items() if e > s]
        return sum(shares) / max(1, len(shares))


def blind(action: Action, profiles: DurationProfiles, now: float) -> Action:
    """The action as a real scheduler sees it on arrival (`DurationProfiles.as_seen`, the
    runtime's rule): learned from completed actions, never the sampled truth."""
    return profiles.as_seen(action, now)


class _Trajectories(Driver):
    """Trajectories as closed loops: a trajectory begins when its lifecycle lets it (pending
    ones first come first served), its next action arrives its LLM generation time after the
    previous one completed, and its environment is bound to the node its lifecycle opened it on
    (`Lifecycle.nodes`), else to where its first action of a core pool was placed."""

    def __init__(self, sim: ClosedLoopSimulator) -> None:
        self.sim = sim
        self.life = sim.policy.lifecycle
        self.trajs = {t.id: t for t in sim.workload.trajectories}
        self.step: dict[str, tuple[str, int]] = {}  # action id -> (trajectory, step)
        self.kinds: dict[str, tuple[str, str, str]] = {}
        self.setups: dict[str, tuple[float, float]] = {}
        self.spans: dict[str, tuple[float, float]] = {}
        self.pending: deque[Trajectory] = deque()
        self.done = 0

    def begin(self, engine: Engine) -> None:
        for t in self.trajs.values():
            engine.push(t.start, START, t.id)

    def _open(self, engine: Engine, t: Trajectory, now: float) -> bool:
        engine.settle()  # the lifecycle reads the pools: every grant made must be in them
        delay = self.life.start(t, now)
        if delay is None:
            return False
        self.setups[t.id] = (t.start, now + delay)
        for r, node in self.life.nodes(t, now).items():
            engine.scheduler.bind(t.id, r, node)
        engine.push(now + delay + t.steps[0].think_s, ARRIVAL, (t.id, 0))
        return True

    def handle(self, engine: Engine, kind: int, key: Any, now: float) -> bool | None:
        if kind == START:  # an event to the scheduler where the runtime opens an environment
            t = self.trajs[key]
            if self.pending or not self._open(engine, t, now):
                self.pending.append(t)
            return bool(self.sim.core_pools)
        tid, step = key
        truth = self.trajs[tid].steps[step].action
        seen = (
            dataclasses.replace(truth, submit_time=now)
            if self.sim.oracle
            else engine.scheduler.profiles.as_seen(truth, now)
        )
        engine.submit(seen, truth)
        self.kinds[seen.id] = (tid, seen.task or "", seen.kind)
        self.step[seen.id] = (tid, step)

    def started(self, engine: Engine, a: Assignment, now: float) -> None:
        sched = engine.scheduler
        tid = a.action.trajectory or ""
        for r in self.sim.core_pools:
            if r in a.units and (tid, r) not in sched.bindings:
                sched.bind(tid, r, a.placement[r].node)

    def completed(self, engine: Engine, action: Action, now: float) -> None:
        tid, step = self.step.pop(action.id)
        t = self.trajs[tid]
        self.done += 1
        if step + 1 < len(t.steps):
            think = t.steps[step + 1].think_s
            engine.push(now + think, ARRIVAL if think > 0 else REACTION, (tid, step + 1))
            return
        self.spans[tid] = (t.start, now)
        self.life.end(t, now)
        engine.scheduler.unbind(tid)
        while self.pending and self._open(engine, self.pending[0], now):
            self.pending.popleft()

    def wakeup(self, now: float) -> float | None:
        return self.life.wakeup(now)


class ClosedLoopSimulator:
    """`oracle=False` (the default, as in the paper): the scheduler estimates durations from
    history per action kind (`blind`); `oracle=True` hands it each action's sampled duration."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        progress: Callable[[int, int], None] | None = None,
        oracle: bool = False,
        on_decision: Callable[[Scheduler, float], None] | None = None,
        sharing: Sharing | None = None,
    ) -> None:
        """`on_decision(scheduler, cpu_s)` is called after every decision the scheduler made
        (the scale bench attributes its CPU to the nodes it touched); `sharing`: what runs
        beside an action slows it (`evaluation.engine.Sharing`; None: it never does)."""
        self.on_decision = on_decision
        self.sharing = sharing
        self.workload = workload
        self.policy = policy
        self.oracle = oracle
        pools = workload.make_pools()
        self.executors = {
            **(
                policy.executors(workload)
                if policy.executors is not None
                else default_executors(workload)
            ),
            **api_executors(workload),
        }
        for r, ex in self.executors.items():
            if isinstance(ex, SimServiceModel) and r in pools:
                pools[r].advisor = ex.advisor  # the pool's own residency advice
        self.scheduler = policy.make_scheduler(pools, policy.allocator, scoped=policy.scoped)
        self.core_pools = {r for r, p in pools.items() if isinstance(p, CorePool)}
        self.progress = progress
        policy.lifecycle.attach(self.scheduler.pools, self.executors)

    def run(self) -> LoopResult:
        sched = self.scheduler
        for t in self.workload.trajectories:
            for s in t.steps:
                sched.validate(s.action)
        total = self.workload.num_actions
        progress = self.progress
        engine = Engine(
            sched,
            self.executors,
            on_decision=self.on_decision,
            progress=None if progress is None else (lambda d: progress(d, total)),
            sharing=self.sharing,
        )
        driver = _Trajectories(self)
        out = engine.run(driver)
        if driver.pending:
            raise TangramError(f"{len(driver.pending)} trajectories never began")
        counters = out.counters
        ups = {id(e): e for e in self.executors.values() if isinstance(e, ApiUpstream)}
        counters["api_429"] = float(sum(u.total for u in ups.values()))
        half = max((e for _, e in driver.spans.values()), default=0.0) / 2  # 429s after it: late
        counters["api_429_late"] = float(sum(t > half for u in ups.values() for t in u.refused_at))
        return LoopResult(
            out.records, driver.kinds, driver.setups, driver.spans, counters, out.decision_cpu_s
        )


def default_executors(workload: Workload) -> dict[str, SimExecutor]:
    """The GPU manager's residency model (restore on a miss, LRU) when services are declared."""
    if workload.gpu is None or not workload.gpu.services:
        return {}

    return {workload.gpu.name: SimServiceModel(workload.gpu)}


def api_executors(workload: Workload) -> dict[str, SimExecutor]:
    """The API servers (`evaluation.upstream`), one shared model for every `api:*` limit."""
    limits = workload.api_limits
    if not limits:
        return {}
    up = ApiUpstream(dict(limits))
    return {r: up for r in limits}


def run(
    workload: Workload,
    policy: Policy,
    progress=None,
    oracle: bool = False,
    on_decision=None,
    sharing: Sharing | None = None,
) -> LoopResult:
    return ClosedLoopSimulator(workload, policy, progress, oracle, on_decision, sharing).run()
