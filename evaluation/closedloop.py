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
import heapq
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from evaluation.simulator import ActionRecord, SimExecutor, modelled_duration
from evaluation.upstream import ApiUpstream
from evaluation.workloads.base import Trajectory, Workload
from managers.gpu.sim import SimServiceModel
from tangram.actions import Action
from tangram.allocation import Allocator
from tangram.errors import TangramError
from tangram.pools import CorePool, Pool
from tangram.profiles import DurationProfiles
from tangram.scheduler import Scheduler

COMPLETION, START, ARRIVAL, WAKE = 0, 1, 2, 3


class Lifecycle(Protocol):
    def attach(self, pools: Mapping[str, Pool], executors: Mapping[str, SimExecutor]) -> None: ...
    def start(self, traj: Trajectory, now: float) -> float | None: ...
    def end(self, traj: Trajectory, now: float) -> None: ...
    def wakeup(self, now: float) -> float | None: ...


@dataclass
class EnvironmentStart:
    """Tangram's lifecycle: one container per trajectory holding no cores (memory only, which
    is assumed never to bind), started in `start_s` (docs/calibration.md §2: 0.5 s)."""

    start_s: float = 0.5

    def attach(self, pools, executors) -> None:
        pass

    def start(self, traj: Trajectory, now: float) -> float | None:
        return self.start_s

    def end(self, traj: Trajectory, now: float) -> None:
        pass

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
    records: dict[str, ActionRecord]
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
    """The action as a real scheduler sees it on arrival: its kind's historical mean duration
    (non-scalable) or its kind's fitted `T_ori` with the kind's E(m) (elastic), learned online
    from completed actions; never the sampled truth. Before any history: the profiles' default.
    """
    el = action.elasticity
    if el is not None:
        t_ori = profiles.t_ori(action.kind) or profiles.default
        return dataclasses.replace(action, submit_time=now,
                                   elasticity=dataclasses.replace(el, t_ori=t_ori))
    return dataclasses.replace(action, submit_time=now, duration=None)


class ClosedLoopSimulator:
    """`oracle=False` (the default, as in the paper): the scheduler estimates durations from
    history per action kind (`blind`); `oracle=True` hands it each action's sampled duration."""

    def __init__(self, workload: Workload, policy: Policy,
                 progress: Callable[[int, int], None] | None = None,
                 oracle: bool = False,
                 on_decision: Callable[[Scheduler, float], None] | None = None) -> None:
        """`on_decision(scheduler, cpu_s)` is called after every decision the scheduler made
        (the scale bench attributes its CPU to the nodes it touched)."""
        self.on_decision = on_decision
        self.workload = workload
        self.policy = policy
        self.oracle = oracle
        pools = workload.make_pools()
        self.executors = {**(policy.executors(workload) if policy.executors is not None
                             else default_executors(workload)), **api_executors(workload)}
        prefer = defer = None
        for ex in self.executors.values():
            prefer = getattr(ex, "prefer", prefer)
            defer = getattr(ex, "defer", defer)
        self.scheduler = policy.make_scheduler(pools, policy.allocator, prefer=prefer,
                                               defer=defer, scoped=policy.scoped)
        self.core_pools = {r for r, p in pools.items() if isinstance(p, CorePool)}
        self.progress = progress
        policy.lifecycle.attach(self.scheduler.pools, self.executors)

    def run(self) -> LoopResult:
        sched, life = self.scheduler, self.policy.lifecycle
        trajs = {t.id: t for t in self.workload.trajectories}
        for t in trajs.values():
            for s in t.steps:
                sched.validate(s.action)
        events: list[tuple[float, int, int, str, int]] = []
        seq = 0

        def push(at: float, kind: int, tid: str = "", step: int = 0) -> None:
            nonlocal seq
            heapq.heappush(events, (at, kind, seq, tid, step))
            seq += 1

        for t in trajs.values():
            push(t.start, START, t.id)
        records: dict[str, ActionRecord] = {}
        kinds: dict[str, tuple[str, str, str]] = {}
        setups: dict[str, tuple[float, float]] = {}
        spans: dict[str, tuple[float, float]] = {}
        starts: dict[str, tuple[float, bool | None, int]] = {}
        run_s: dict[str, float] = {}  # true run time (restores excluded), what profiles learn
        pending: deque[Trajectory] = deque()
        wakes: set[float] = set()
        counters = {"events": 0.0, "restores": 0.0, "decide_wall_s": 0.0, "decide_cpu_s": 0.0,
                    "overhead_s": 0.0}
        cpu_s = array("d")
        total = self.workload.num_actions
        done = 0

        def begin(t: Trajectory, now: float) -> bool:
            delay = life.start(t, now)
            if delay is None:
                return False
            setups[t.id] = (t.start, now + delay)
            push(now + delay + t.steps[0].think_s, ARRIVAL, t.id, 0)
            return True

        while events:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, _, tid, step = heapq.heappop(events)
                counters["events"] += 1
                if kind == COMPLETION:
                    truth = trajs[tid].steps[step].action
                    aid = truth.id
                    ra = sched.complete(aid, now, run_s=run_s.pop(aid), learn=not self.oracle)
                    a = ra.assignment
                    for r in a.units:
                        ex = self.executors.get(r)
                        if ex is not None:
                            ex.end(a, now)
                    s0, restored, _ = starts.pop(aid)
                    records[aid] = ActionRecord(a.action.submit_time, s0, now, dict(a.units),
                                                restored)
                    done += 1
                    t = trajs[tid]
                    if step + 1 < len(t.steps):
                        push(now + t.steps[step + 1].think_s, ARRIVAL, tid, step + 1)
                    else:
                        spans[tid] = (t.start, now)
                        life.end(t, now)
                        sched.unbind(tid)
                        while pending and begin(pending[0], now):
                            pending.popleft()
                elif kind == START:
                    t = trajs[tid]
                    if pending or not begin(t, now):
                        pending.append(t)
                elif kind == ARRIVAL:
                    tmpl = trajs[tid].steps[step].action
                    act = (dataclasses.replace(tmpl, submit_time=now) if self.oracle
                           else blind(tmpl, sched.profiles, now))
                    sched.enqueue(act)
                    kinds[act.id] = (tid, act.task or "", act.kind)
                    starts[act.id] = (now, None, step)  # arrival bookkeeping, replaced at start
                else:
                    wakes.discard(now)
            made = sched.decisions
            t0, c0 = time.perf_counter(), time.thread_time()
            decided = sched.decide(now)
            c1 = time.thread_time()
            counters["decide_wall_s"] += time.perf_counter() - t0
            if sched.decisions != made:  # an empty queue answers at once: not a decision
                cpu_s.append(c1 - c0)
                counters["decide_cpu_s"] += c1 - c0
                if self.on_decision is not None:
                    self.on_decision(sched, c1 - c0)
            for a in decided:
                act = a.action
                tid = act.trajectory or ""
                for r in self.core_pools:
                    if r in a.units and (tid, r) not in sched.bindings:
                        sched.bind(tid, r, a.placement[r].node)
                step = starts[act.id][2]
                dur = modelled_duration(trajs[tid].steps[step].action, a.units)
                run_s[act.id] = dur
                restored = None
                for r in a.units:
                    ex = self.executors.get(r)
                    if ex is not None:
                        extra, restored = ex.begin(a, now)
                        dur += extra
                        counters["overhead_s"] += extra
                        counters["restores"] += bool(restored)
                starts[act.id] = (now, restored, step)
                push(now + dur, COMPLETION, tid, step)
            w = life.wakeup(now)
            if w is not None and w > now and w not in wakes:
                wakes.add(w)
                push(w, WAKE)
            if self.progress is not None:
                self.progress(done, total)
        if sched.queue or pending:
            raise TangramError(f"{len(sched.queue)} actions never started, {len(pending)} "
                               f"trajectories never began")
        counters["decisions"] = sched.decisions
        ups = {id(e): e for e in self.executors.values() if isinstance(e, ApiUpstream)}
        counters["api_429"] = float(sum(u.total for u in ups.values()))
        counters["actions"] = done
        return LoopResult(records, kinds, setups, spans, counters, cpu_s)


def default_executors(workload: Workload) -> dict[str, SimExecutor]:
    """The GPU manager's residency model (restore on a miss, LRU) when services are declared."""
    if workload.gpu is None or not workload.gpu.services:
        return {}

    return {workload.gpu.name: SimServiceModel(workload.gpu)}


def api_executors(workload: Workload) -> dict[str, SimExecutor]:
    """The API servers (`evaluation.upstream`), one shared model for every `api:*` limit."""
    limits = workload.extra.get("api_limits") or {}
    if not limits:
        return {}
    up = ApiUpstream(dict(limits))
    return {r: up for r in limits}


def run(workload: Workload, policy: Policy, progress=None, oracle: bool = False,
        on_decision=None) -> LoopResult:
    return ClosedLoopSimulator(workload, policy, progress, oracle, on_decision).run()
