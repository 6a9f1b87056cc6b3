"""The one event loop of the evaluation: the real `Scheduler` on a virtual clock.

Both the open-loop replay of an instance file (`evaluation.simulator`) and the closed-loop,
trajectory-driven simulation (`evaluation.closedloop`) are *drivers* of this engine: a driver
pushes its own events (arrivals, trajectory starts, a policy's wake-ups) and hears of every
completion; the engine owns what happens to an action between its submission and its end, the
same for every driver and the same as the runtime (`tangram.runtime.facade`) does it:

- the scheduler decides once per instant, after every event of that instant was handled
  (completions first, so freed units are visible to the decision);
- a started action runs its modelled duration (the *truth* the driver gave at submission,
  which the scheduler never sees unless the driver hands it over) plus what the managers' time
  models add (`SimExecutor.begin`: a GPU service restore);
- an action that would run past its `Action.timeout` is killed there: `Status.TIMEOUT`;
- with a `Sharing` model, a running action's remaining time stretches or shrinks with what
  runs beside it (processor sharing, recomputed at every start and end);
- every completion goes back through `Scheduler.complete` with its status, so the estimator
  learns by the runtime's rule (`DurationProfiles.record`: timeouts as censored observations).

Events are ordered by (time, kind, sequence): completions first, a driver's own kinds (1, 2,
...) next, wake-ups last. One decision follows all the events of an instant, except that a
driver's reactions (kinds >= `AFTER`: a trajectory's next action submitted with no LLM gap)
come after it and get a decision of their own, as they do in the runtime.
"""

from __future__ import annotations

import heapq
import math
import time
from abc import ABC, abstractmethod
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import TangramError
from tangram.results import ScheduledAction, Status
from tangram.scheduler import Scheduler

COMPLETION = 0  # the engine's own event kinds; a driver's kinds lie between them
AFTER = 1 << 20  # a driver kind >= AFTER is handled after its instant's decision, as a client
# reacting to a result at once (zero delay) is in the runtime: it submits after the decision
WAKE = 1 << 30  # a driver asked for a decision at this time (`Driver.wakeup`)


class SimExecutor(Protocol):
    """Models the time a manager adds around an action (e.g. a GPU service restore)."""

    def begin(self, assignment: Assignment, now: float) -> tuple[float, bool]: ...
    def end(self, assignment: Assignment, now: float) -> None: ...


class Sharing(Protocol):
    """What runs beside an action slows it (`Engine(sharing=...)`): processor sharing. Each
    running action's remaining work (seconds as it would run alone at its grant) progresses
    at `rates(running)[id]` per second; the rates are recomputed at every start and end. A
    timeout caps the work (seconds alone), not the slowed time."""

    def rates(
        self, running: Mapping[str, tuple[Action, Mapping[str, int]]]
    ) -> dict[str, float]: ...


def modelled_duration(action: Action, units: Mapping[str, int]) -> float:
    """The action's true run time with `units` (what the simulator plays, not an estimate)."""
    el = action.elasticity
    if el is not None:
        return el.duration(units[el.key])
    if action.duration is None:
        raise TangramError(f"action {action.id}: the simulator needs a modelled duration")
    return action.duration


def shortest_run(action: Action) -> float:
    """The shortest the action can run, whatever units it is given (its timeout included)."""
    el = action.elasticity
    if el is not None:
        run = min(el.duration(m) for m in action.demands[el.key].amounts)
    else:
        run = action.duration if action.duration is not None else 0.0
    return run if action.timeout is None else min(run, action.timeout)


class Driver(ABC):
    """What feeds the engine. `begin` pushes the first events; `handle` is called for each of
    the driver's own events; `completed` after each action's completion (a closed loop
    submits the trajectory's next action from there); `started` after each start."""

    @abstractmethod
    def begin(self, engine: Engine) -> None: ...

    @abstractmethod
    def handle(self, engine: Engine, kind: int, key: Any, now: float) -> bool | None:
        """Handle one of the driver's events; False: it is no event to the scheduler (the
        runtime would not decide on it), so it alone does not make the instant decide."""

    def completed(self, engine: Engine, action: Action, now: float) -> None:
        """Nothing follows a completion unless the driver says so."""

    def started(self, engine: Engine, assignment: Assignment, now: float) -> None:
        """Nothing to do at a start unless the driver says so."""

    def wakeup(self, now: float) -> float | None:
        """The next time the driver wants a decision although nothing happens, or None."""
        return None


@dataclass
class EngineRun:
    records: dict[str, ScheduledAction]  # each action's life on the virtual clock
    counters: dict[str, float]
    decision_cpu_s: array = field(default_factory=lambda: array("d"))
    """CPU seconds (this thread) of each decision the scheduler made, in order."""


class Engine:
    """One simulation: a scheduler, the managers' time models, and the event heap.

    `on_decision(scheduler, cpu_s)` is called after every decision the scheduler made;
    `progress(done)` after every instant. `timed=False` skips the decisions' CPU clock (two
    system calls a decision: a tenth of an open-loop replay's time)."""

    # A diagnostic only (`python -m evaluation.shardreplay --stretch`): collect deferred grants
    # this many times later than the exact bound, to see what batches that long would cost.
    # Above 1 a grant can end before events already handled, so the schedule is not exact.
    collect_stretch = 1.0

    def __init__(
        self,
        scheduler: Scheduler,
        executors: Mapping[str, SimExecutor] | None = None,
        *,
        on_decision: Callable[[Scheduler, float], None] | None = None,
        progress: Callable[[int], None] | None = None,
        timed: bool = True,
        sharing: Sharing | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.sharing = sharing
        # under `sharing`: id -> [remaining work, rate, last update, version, action, units]
        self._shared: dict[str, list[Any]] = {}
        self.timed = timed or on_decision is not None
        self.executors = dict(executors or {})
        self.on_decision = on_decision
        self.progress = progress
        self.events: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._truth: dict[str, Action] = {}
        self._run: dict[str, tuple[float, float, bool | None, Status]] = {}
        self.records: dict[str, ScheduledAction] = {}
        self.counters: dict[str, float] = {
            "events": 0.0,
            "restores": 0.0,
            "decide_wall_s": 0.0,
            "decide_cpu_s": 0.0,
            "overhead_s": 0.0,
            "timeouts": 0.0,
        }
        self._cpu_s = array("d")
        self._wakes: set[float] = set()
        self._decision_no = 0  # the completions an instant's grants push sort by (decision, rank)
        self._later: dict[int, tuple[float, int, int]] = {}  # deferred instant -> (now, no, rank)
        # deferred grants: the actions submitted and not started here yet (a grant the scheduler
        # owes can only be one of them), and their shortest runs in a heap
        self._waiting: set[str] = set()
        self._floors: list[tuple[float, str]] = []
        self._floor_read = False  # whether the queue before the first deferred grant is in it

    def push(self, at: float, kind: int, key: Any = None) -> None:
        heapq.heappush(self.events, (at, kind, self._seq, key))
        self._seq += 1

    def submit(self, seen: Action, truth: Action | None = None) -> None:
        """Queue `seen` (what the scheduler knows, already validated); `truth` is what it
        runs (`seen` itself when None)."""
        if truth is not None and truth is not seen:
            self._truth[seen.id] = truth
        if getattr(self.scheduler, "defers_grants", False):
            self._wait_for(seen.id, shortest_run(truth or seen))
        self.scheduler.enqueue(seen)

    def _wait_for(self, aid: str, run: float) -> None:
        self._waiting.add(aid)
        heapq.heappush(self._floors, (run, aid))

    def settle(self) -> None:
        """Start every grant a scheduler that answers later (`defers_grants`) has made so far:
        a driver calls it before it reads the pools (where an environment opens)."""
        if getattr(self.scheduler, "defers_grants", False):
            self._collect(self._driver)
            self.scheduler.sync_pools()

    def _collect(self, driver: Driver) -> None:
        for tag, _, grants in self.scheduler.collect():
            now, no, rank = self._later.pop(tag)
            for k, a in enumerate(grants, rank):
                if any(r in self.executors for r in a.units):
                    raise TangramError(
                        f"action {a.action.id}: a grant answered later cannot start a "
                        f"manager's time model ({sorted(set(a.units) & set(self.executors))})"
                    )
                self._start(a, now, (no, k))
                driver.started(self, a, now)

    def _must_collect(self, events: list) -> bool:
        """Whether the deferred grants must be started before the next event: a grant made at
        t ends at t plus its run at the earliest, so an event before that cannot depend on it.
        """
        since = self.scheduler.outstanding_since()
        if since is None:
            return False
        if not self._floor_read:  # the actions queued before the scheduler deferred
            self._floor_read = True
            for a in self.scheduler.queue:
                self._wait_for(a.id, shortest_run(self._truth.get(a.id, a)))
        floors, waiting = self._floors, self._waiting
        while floors and floors[0][1] not in waiting:  # started meanwhile
            heapq.heappop(floors)
        floor = floors[0][0] if floors else math.inf
        return not events or events[0][0] >= since + floor * self.collect_stretch

    def run(self, driver: Driver) -> EngineRun:
        driver.begin(self)
        self._driver = driver
        events, sched = self.events, self.scheduler
        done = 0
        while events or getattr(sched, "defers_grants", False):
            if getattr(sched, "defers_grants", False) and self._must_collect(events):
                self._collect(driver)
                continue
            if not events:
                break
            now = events[0][0]
            after = AFTER <= events[0][1] < WAKE  # this round: the instant's reactions
            decide = False
            while events and events[0][0] == now and (AFTER <= events[0][1] < WAKE) == after:
                _, kind, _, key = heapq.heappop(events)
                self.counters["events"] += 1
                if kind == COMPLETION:
                    if self.sharing is not None:
                        key = self._current(key)
                        if key is None:  # a completion its rate change moved
                            continue
                    driver.completed(self, self._complete(key, now), now)
                    done += 1
                    decide = True
                elif kind == WAKE:
                    self._wakes.discard(now)
                    decide = True
                elif driver.handle(self, kind, key, now) is not False:
                    decide = True
            if decide:
                self._decide(driver, now)
            w = driver.wakeup(now)
            if w is not None and w > now and w not in self._wakes:
                self._wakes.add(w)
                self.push(w, WAKE)
            if self.progress is not None:
                self.progress(done)
        if sched.queue:
            raise TangramError(
                f"{len(sched.queue)} actions never started (first: "
                f"{next(iter(sched.queue.keys()))})"
            )
        self.counters["decisions"] = sched.decisions
        self.counters["actions"] = done
        return EngineRun(self.records, self.counters, self._cpu_s)

    def _decide(self, driver: Driver, now: float) -> None:
        sched = self.scheduler
        if not sched.queue:  # nothing to decide: no decision (the scheduler agrees)
            return
        self._decision_no += 1
        if not self.timed:
            self._started(driver, sched.decide(now), now)
            return
        made = sched.decisions
        t0, c0 = time.perf_counter(), time.thread_time()
        decided = sched.decide(now)
        c1 = time.thread_time()
        self.counters["decide_wall_s"] += time.perf_counter() - t0
        if sched.decisions != made:  # an empty queue answers at once: not a decision
            self._cpu_s.append(c1 - c0)
            self.counters["decide_cpu_s"] += c1 - c0
            if self.on_decision is not None:
                self.on_decision(sched, c1 - c0)
        self._started(driver, decided, now)

    def _started(self, driver: Driver, decided: list[Assignment], now: float) -> None:
        no = self._decision_no
        for k, a in enumerate(decided):
            self._start(a, now, (no, k))
            driver.started(self, a, now)
        if getattr(self.scheduler, "defers_grants", False):
            tag = self.scheduler.last_instant
            if tag is not None and tag not in self._later:  # its shards answer later
                self._later[tag] = (now, no, len(decided))

    def _start(self, a: Assignment, now: float, order: tuple[int, int]) -> None:
        act = a.action
        self._waiting.discard(act.id)
        truth = self._truth.get(act.id, act)
        run_s = modelled_duration(truth, a.units)
        status = Status.OK
        if truth.timeout is not None and run_s > truth.timeout:
            run_s, status = truth.timeout, Status.TIMEOUT  # killed at its deadline
        extra, restored = 0.0, None
        for r in a.units:
            ex = self.executors.get(r)
            if ex is not None:
                x, restored = ex.begin(a, now)
                extra += x
                self.counters["restores"] += bool(restored)
        self.counters["overhead_s"] += extra
        self._run[act.id] = (now, run_s, restored, status)
        if self.sharing is not None:  # (the twin: no deferred grants, so no decision order)
            self._shared[act.id] = [run_s + extra, 1.0, now, 0, truth, dict(a.units)]
            self._reshare(now)
            return
        # completions at one time sort by the decision that started them, then the grant's rank
        heapq.heappush(self.events, (now + run_s + extra, COMPLETION, order, act.id))

    def _current(self, key: tuple[str, int]) -> str | None:
        """The action a shared completion event ends, or None where it is stale."""
        aid, version = key
        s = self._shared.get(aid)
        return aid if s is not None and s[3] == version else None

    def _reshare(self, now: float) -> None:
        """Progress every running action to `now` at its old rate, then give each its new rate
        and completion (a new version: the old event is stale)."""
        assert self.sharing is not None
        shared = self._shared
        for s in shared.values():
            s[0] = max(0.0, s[0] - (now - s[2]) * s[1])
            s[2] = now
        rates = self.sharing.rates({aid: (s[4], s[5]) for aid, s in shared.items()})
        for aid, s in shared.items():
            r = rates.get(aid, 1.0)
            if r <= 0:
                raise TangramError(f"action {aid}: sharing rate {r!r} must be positive")
            if r != s[1] or s[3] == 0:
                s[1], s[3] = r, s[3] + 1
                self.push(now + s[0] / r, COMPLETION, (aid, s[3]))

    def _complete(self, aid: str, now: float) -> Action:
        start, run_s, restored, status = self._run.pop(aid)
        if self._shared and self._shared.pop(aid, None) is not None:
            run_s = now - start  # as it ran beside the others
            self._reshare(now)
        truth = self._truth.pop(aid, None)
        # learned at 1 ns, as the runtime learns its measured times: a tie between two equal-cost
        # arrangements is not broken by a float's last digits differing between the two
        a = self.scheduler.complete(aid, now, run_s=round(run_s, 9), status=status).assignment
        for r in a.units:
            ex = self.executors.get(r)
            if ex is not None:
                ex.end(a, now)
        self.counters["timeouts"] += status is Status.TIMEOUT
        self.records[aid] = ScheduledAction(
            a.action if truth is None else truth,  # the action as it ran
            a.action.submit_time,
            start,
            now,
            dict(a.units),
            dict(a.placement),
            status,
            restored,
        )
        return a.action
