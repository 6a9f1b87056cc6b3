"""The scheduler loop: one queue, the policy called on every arrival and completion (unless no
unit a queued action needs is free), every decision applied and checked against the invariants.

The same loop serves the simulator (virtual clock) and the runtime (wall clock): it never knows
which one drives it.

Liveness (docs/architecture.md, "Liveness"). Whatever the policy answers, a decision never
leaves the queue stranded: if, after applying the policy's assignments, nothing is running and
some queued action fits at its minimum now, the scheduler starts the first such action (in
queue order) at its best amount that fits. Any running action's completion calls `decide`
again, so an action the policy puts off always has a completion coming that re-runs the
decision. Admission refuses what can never run: a demand over every pool's capacity, over the
capacity of the node its trajectory is bound to, or past `max_queue`.

Work conservation (`tangram.conservation`, docs/architecture.md section 6). Then, whatever the
policy, no queued action waits while every amount it allows fits the free units of its pool (on
its bound node) and nothing ahead of it on its pools is blocked: the scheduler starts each such
action, in queue order, at its fastest amount (`conserved` counts them; the shipped policies
need none; `conserve=False` turns the rule off to measure a policy alone, and a baseline that
models a system keeping units idle by design is marked `IdleByDesign`).

A scoped scheduler (`scoped=True`, docs/scale.md) shows the policy only the queue classes that
an arrival, completion, cancel or `touch` changed since the last decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tangram.actions import Action
from tangram.allocation import (
    Allocator,
    Assignment,
    ClusterView,
    IdleByDesign,
    RunningAction,
    check_assignment_shape,
)
from tangram.bindings import Bindings
from tangram.conservation import advisors_excuse, wasted_now
from tangram.errors import Infeasible, InvariantError, QueueFull, TangramError, ValidationError
from tangram.liveness import rescue
from tangram.pools import Pool
from tangram.profiles import DurationProfiles
from tangram.queue import ActionQueue
from tangram.rereads import Rereads
from tangram.results import Status


def _never(_: object) -> bool:
    return False


@dataclass(frozen=True, slots=True, eq=False)
class PreparedDecision:
    """A decision whose policy call may run in another thread (`Scheduler.prepare`): the
    policy, the snapshot it reads and the time it decides for."""

    allocator: Allocator
    view: ClusterView
    queue: ActionQueue
    now: float

    def allocate(self) -> list[Assignment]:
        """The policy's answer (thread-safe: it reads only this snapshot)."""
        return list(self.allocator.allocate(self.view, self.queue, self.now))


DEFAULT_MAX_QUEUE = 100_000  # queued actions; past it `submit` raises QueueFull (HTTP 429)


class Scheduler:
    """The scheduler of one process (the module docstring); `tangram.scheduling` says what it
    promises the runtime, as the sharded one does."""

    places_vector_actions = True  # an action over several pools is placed as one grant
    splits_decisions = True  # `prepare` and `finish`: the policy may run off the event loop

    def __init__(
        self,
        pools: Mapping[str, Pool],
        allocator: Allocator,
        *,
        profiles: DurationProfiles | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        scoped: bool = False,
        conserve: bool = True,
    ) -> None:
        self.pools = dict(pools)
        self.allocator = allocator
        self.profiles = profiles or DurationProfiles()
        self.max_queue = max_queue
        self.scoped = scoped  # decide only the queue classes an event touched (docs/scale.md)
        self._touched: set[tuple[str, str | None]] = set()
        self._rereads = Rereads()  # put-off classes, each re-read when due (tangram.rereads)
        self.last_scope: list[tuple[str, str | None]] | None = None  # what the last one scanned
        self.queue = ActionQueue()
        self.running: dict[str, RunningAction] = {}
        # (resource, node) and (resource, None) -> running actions holding its units there
        self._holding: dict[tuple[str, str | None], dict[str, RunningAction]] = {}
        # trajectory -> node per resource; the runtime attaches the environments' own record
        self.bindings = Bindings()
        self.decisions = 0
        self.rescued = 0  # actions started by the liveness rule, not by the policy
        # enforce work conservation after every decision (not on a baseline's: `IdleByDesign`)
        self.conserve = conserve and not isinstance(allocator, IdleByDesign)
        self.conserved = 0  # actions started by the work-conservation rule, not by the policy
        self._queued_per_resource: dict[str, int] = {}

    # -- admission -------------------------------------------------------------------------------
    def validate(self, action: Action) -> None:
        """Reject an action no pool can ever serve: unknown resource, a demand over the pool's
        capacity, or over the capacity of the node the action's trajectory is bound to."""
        for r, d in action.demands.items():
            pool = self.pools.get(r)
            if pool is None:
                raise ValidationError(
                    f"action[{action.id}].demands.{r}",
                    d.amounts,
                    f"unknown resource (pools: {sorted(self.pools)})",
                )
            pool.validate_amounts(f"action[{action.id}].demands.{r}", d.amounts)
            node = self.node_of(action, r)
            if node is not None:
                cap = pool.capacity(node)
                if d.min > cap:
                    raise Infeasible(
                        f"action {action.id}: {r} demand {d.min} can never run on node {node}, "
                        f"which has {cap} {r} units (trajectory {action.trajectory} is bound "
                        "there)"
                    )

    def node_of(self, action: Action, resource: str) -> str | None:
        if action.trajectory is None:
            return None
        return self.bindings.get((action.trajectory, resource))

    def submit(self, action: Action) -> None:
        if action.id in self.queue or action.id in self.running:
            raise ValidationError("action.id", action.id, "already queued or running")
        if len(self.queue) >= self.max_queue:
            raise QueueFull(f"the queue holds its maximum of {self.max_queue} actions; retry later")
        self.validate(action)
        self.enqueue(action)

    def enqueue(self, action: Action) -> None:
        """Queue an already validated action (the simulator validates all up front)."""
        classes = []
        for r in action.mins:
            pool = self.pools[r]
            classes.append((r, self.node_of(action, r) if pool.per_node else None))
        self.queue.add(action, classes)
        self._touched.update(classes)
        counts = self._queued_per_resource
        for r in action.mins:
            counts[r] = counts.get(r, 0) + 1

    def _dequeue(self, action_id: str) -> Action | None:
        action = self.queue.remove(action_id)
        if action is not None:
            counts = self._queued_per_resource
            for r in action.mins:
                counts[r] -= 1
                if not counts[r]:
                    del counts[r]
        return action

    def cancel(self, action_id: str) -> bool:
        """Drop a queued action; False when it is not queued (running or unknown). The caller
        runs `decide` next: the cancelled action may have been blocking others."""
        action = self._dequeue(action_id)
        if action is None:
            return False
        for r in action.mins:  # it may have blocked the actions behind it
            node = self.node_of(action, r) if self.pools[r].per_node else None
            if node is None:  # not bound: it blocked every node of the resource
                self.touch(r)
            else:
                self._touched.add((r, node))
        return True

    def bind(self, trajectory: str, resource: str, node: str) -> None:
        """Bind a trajectory on a resource whose bindings no environment owner keeps (the
        simulator's); on an attached one, check it agrees (`tangram.bindings`)."""
        self.bindings.bind(trajectory, resource, node)

    def unbind(self, trajectory: str) -> None:
        self.bindings.unbind(trajectory)

    def attach_bindings(self, resource: str, owner: Mapping[str, str]) -> None:
        """One binding record: `owner` answers for `resource` (`Bindings.attach`)."""
        self.bindings.attach(resource, owner)

    # -- decisions -------------------------------------------------------------------------------
    def estimate(self, action: Action, units: int | None = None) -> float:
        return self.profiles.estimate(action, units)

    def view(self, scope: list[tuple[str, str | None]] | None = None) -> ClusterView:
        return ClusterView(
            self.pools,
            self.running.values(),
            self.bindings,
            self.estimate,
            self._queued_per_resource.keys(),
            scope,
            self.holding,
        )

    def _scope(self) -> list[tuple[str, str | None]]:
        """The classes a scoped decision scans: those an arrival, completion or cancel touched
        since the last decision. A resource with actions waiting pool-wide (not bound to a
        node, or a pooled resource) is scanned whole: such an action may go to any node, and
        when it blocks the resource it hides every class of it from the scan."""
        queue = self.queue
        pooled = [r for r in self._queued_per_resource if queue.has_class((r, None))]
        if pooled:  # rare in steady state: the whole of those resources
            scope = [c for c in queue.classes() if c[0] in pooled or c in self._touched]
        else:  # the common case costs what the events touched, not the cluster's size
            scope = [c for c in self._touched if queue.has_class(c)]
            scope.sort(key=lambda c: (c[0], c[1] or ""))  # set order is not reproducible
        self._touched.clear()
        return scope

    def touch(self, resource: str, node: str | None = None) -> None:
        """Capacity changed outside `complete` (a node joined the pool): a scoped decision
        must look at that node's queue again (node None: at every class of the resource)."""
        if node is None:
            self._touched.update(c for c in self.queue.classes() if c[0] == resource)
        else:
            self._touched.add((resource, node))

    def holding(self, resource: str, node: str | None = None):
        """The running actions holding units of `resource` (on `node` when given)."""
        held = self._holding.get((resource, node))
        return held.values() if held is not None else ()

    def decide(self, now: float) -> list[Assignment]:
        """Ask the policy which queued actions start now; apply and check its answer; then
        apply the liveness and the work-conservation rules (module docstring)."""
        if not self.queue or self._nothing_free():
            return []
        view = self._open_decision(self.view, now)
        assignments = list(self.allocator.allocate(view, self.queue, now))
        return self._close_decision(view, assignments, now)

    def _nothing_free(self) -> bool:
        """No unit of any resource a queued action needs is free: as every action needs at least
        one unit of each resource it names, none can start, whatever the policy or the rules
        would say, so none is asked (the classes touched meanwhile wait for the next decision)."""
        return not any(self.pools[r].free() for r in self._queued_per_resource)

    def prepare(self, now: float) -> PreparedDecision | None:
        """The same decision as `decide`, split so that the policy's part can run off the
        event loop (`tangram.runtime.decisions`): the policy reads a snapshot of the pools,
        the running actions, the bindings and the queue taken here, so events applied to the
        scheduler meanwhile never change what it reads. None when nothing is queued."""
        if not self.queue or self._nothing_free():
            return None
        view = self._open_decision(self._snapshot_view, now)
        return PreparedDecision(self.allocator, view, self.queue.copy(), now)

    def finish(
        self, prepared: PreparedDecision, assignments: list[Assignment], now: float
    ) -> list[Assignment]:
        """Apply a prepared decision's answer at `now`, as `decide` applies it, less the
        actions no longer queued (cancelled while the policy ran); then the liveness and
        work-conservation rules on the live state. Units are taken by decisions alone and one
        decision runs at a time, so a placement the policy chose is still free unless its node
        left the pool meanwhile (a lost node's chunks): such an assignment is dropped too, and
        its action waits for the next decision."""
        self.queue.visited += prepared.queue.visited
        live = [
            a
            for a in assignments
            if self.queue.get(a.action.id) is a.action and self._still_free(a)
        ]
        return self._close_decision(prepared.view, live, now)

    def _still_free(self, a: Assignment) -> bool:
        """Its placement's nodes still take placements (not gone, not retiring); units taken
        meanwhile would be a broken invariant, which `_start` reports loudly."""
        for r, u in a.units.items():
            pool, node = self.pools[r], a.placement[r].node
            if u and (node not in pool.nodes() or pool.fits(u, node) is None):
                return False
        return True

    def _open_decision(self, make_view, now: float) -> ClusterView:
        self.decisions += 1
        if self._rereads:
            self._touched.update(self._rereads.take(now))
        view = make_view(self._scope() if self.scoped else None)
        self.last_scope = view.scope
        return view

    def _close_decision(
        self, view: ClusterView, assignments: list[Assignment], now: float
    ) -> list[Assignment]:
        for a in assignments:
            self._start(a, now)
        if not self.running and self.queue:
            rescue = self._rescue()
            if rescue is not None:
                self.rescued += 1
                self._start(rescue, now)
                assignments.append(rescue)
        if self.scoped and view.scope:
            self._keep_put_off_in_scope(view.scope, now)
        if self.conserve and self.queue:
            for w in self._wasted(view, now):
                a = Assignment(w.action, dict(w.units), dict(w.placement))
                self.conserved += 1
                self._start(a, now)
                assignments.append(a)
        return assignments

    def _snapshot_view(self, scope: list[tuple[str, str | None]] | None) -> ClusterView:
        """A view that owns its state: copied pools, running actions, bindings and holdings."""
        holding = {k: list(v.values()) for k, v in self._holding.items()}
        return ClusterView(
            {r: p.copy() for r, p in self.pools.items()},
            list(self.running.values()),
            dict(self.bindings),
            self.estimate,
            tuple(self._queued_per_resource),
            scope,
            lambda r, n=None: holding.get((r, n), ()),
        )

    def wants_next_decision(self) -> bool | float:
        """True when a class waits to be re-read at the next decision whatever happens; else
        the earliest time a put-off class is due to be re-read (False: none is). A scheduler
        shard asks the router to tick it then."""
        if self._touched:
            return True
        due = self._rereads.next_due()
        return False if due is None else due

    def _keep_put_off_in_scope(self, scope, now: float) -> None:
        """A scoped decision looks again at each class it scanned whose first action still
        fits at its minimum: the policy put it off by choice (to give it more units later), a
        choice that depends on the time. It is re-read at the next event on its node, or at
        the first decision at or after the earliest estimated end of what runs there, or at
        the next decision when all of that has passed its estimated end (`tangram.rereads`),
        not at every decision anywhere in the cluster."""
        self._rereads.drop(scope)
        for c in scope:
            first = next(self.queue.scan(_never, (c,)), None)
            if first is None or not all(
                self.pools[r].fits(k, self.node_of(first, r)) is not None
                for r, k in first.mins.items()
            ):
                continue
            due = min((e for ra in self.holding(*c) if (e := ra.expected_end) > now), default=None)
            if due is None:
                self._touched.add(c)
            else:
                self._rereads.due(c, due)

    def _wasted(self, view: ClusterView, now: float):
        """The queued actions that waste free units after this decision (scratch placements
        taken in queue order, so they can be applied as they are). With this decision's starts
        running, as the advisors read the cluster (a view only where some pool has one)."""
        excused = None
        if any(p.advisor is not None for p in self.pools.values()):
            excused = advisors_excuse(self.pools, self.view(view.scope), now)
        q, needed = self.queue, self._queued_per_resource
        return wasted_now(self.pools, q, self.node_of, self.estimate, excused, view.scope, needed)

    def _start(self, a: Assignment, now: float) -> None:
        act = a.action
        if self.queue.get(act.id) is not act:
            raise InvariantError(f"policy started {act.id!r}, which is not queued")
        check_assignment_shape(a, self.pools, self.bindings)
        for r, u in a.units.items():
            try:
                self.pools[r].take(a.placement[r], u)
            except Exception as exc:
                raise InvariantError(f"action {act.id}: {r}: {exc}") from exc
        self._dequeue(act.id)
        key = act.key
        est = self.estimate(act, a.units[key] if key else None)
        ra = self.running[act.id] = RunningAction(a, now, now + est)
        for r, u in a.units.items():
            if u:
                for k in ((r, a.placement[r].node), (r, None)):
                    self._holding.setdefault(k, {})[act.id] = ra

    def _rescue(self) -> Assignment | None:  # rare: only when nothing at all is running
        """The liveness rule's start (`tangram.liveness.rescue`)."""
        return rescue(self.pools, self.queue, self.node_of)

    def complete(
        self, action_id: str, now: float, run_s: float | None = None, status: Status = Status.OK
    ) -> RunningAction:
        """Return a finished action's units to the pools and learn from its run time by the
        one learning rule (`DurationProfiles.record`: how it ended decides what it teaches)."""
        ra = self.running.pop(action_id)
        a = ra.assignment
        for r, u in a.units.items():
            pool = self.pools[r]
            pool.release(a.placement[r], u)
            self._touched.add((r, a.placement[r].node if pool.per_node else None))
            if u:
                for k in ((r, a.placement[r].node), (r, None)):
                    del self._holding[k][action_id]
        self.profiles.record(a.action, a.units, now - ra.start if run_s is None else run_s, status)
        return ra

    def take_failed(self) -> tuple[tuple[str, TangramError], ...]:
        """Nothing fails here without running: every queued action starts or is cancelled."""
        return ()

    def close(self) -> None:
        """Nothing to stop: the scheduler runs nothing beside the caller's process."""
