"""The scheduler loop: one queue, the policy called on every arrival and completion, every
decision applied through the pool state and checked against the invariants.

The same loop serves the simulator (virtual clock) and the runtime (wall clock): it never knows
which one drives it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tangram.actions import Action
from tangram.allocation import (
    Allocator,
    Assignment,
    ClusterView,
    RunningAction,
    check_assignment_shape,
)
from tangram.errors import InvariantError, ValidationError
from tangram.pools import Pool
from tangram.profiles import DurationProfiles


class Scheduler:
    def __init__(self, pools: Mapping[str, Pool], allocator: Allocator, *,
                 profiles: DurationProfiles | None = None,
                 prefer: Callable | None = None, defer: Callable | None = None) -> None:
        self.pools = dict(pools)
        self.allocator = allocator
        self.profiles = profiles or DurationProfiles()
        self.prefer = prefer
        self.defer = defer
        self.queue: dict[str, Action] = {}
        self.running: dict[str, RunningAction] = {}
        self.bindings: dict[tuple[str, str], str] = {}
        self.decisions = 0
        self._queued_per_resource: dict[str, int] = {}

    # -- admission -------------------------------------------------------------------------------
    def validate(self, action: Action) -> None:
        """Reject an action no pool can ever serve (unknown resource, demand too large)."""
        for r, d in action.demands.items():
            pool = self.pools.get(r)
            if pool is None:
                raise ValidationError(f"action[{action.id}].demands.{r}", d.amounts,
                                      f"unknown resource (pools: {sorted(self.pools)})")
            pool.validate_amounts(f"action[{action.id}].demands.{r}", d.amounts)

    def submit(self, action: Action) -> None:
        if action.id in self.queue or action.id in self.running:
            raise ValidationError("action.id", action.id, "already queued or running")
        self.validate(action)
        self.enqueue(action)

    def enqueue(self, action: Action) -> None:
        """Queue an already validated action (the simulator validates all up front)."""
        self.queue[action.id] = action
        counts = self._queued_per_resource
        for r in action.mins:
            counts[r] = counts.get(r, 0) + 1

    def _dequeue(self, action_id: str) -> Action | None:
        action = self.queue.pop(action_id, None)
        if action is not None:
            counts = self._queued_per_resource
            for r in action.mins:
                counts[r] -= 1
                if not counts[r]:
                    del counts[r]
        return action

    def cancel(self, action_id: str) -> bool:
        """Drop a queued action; False when it is not queued (running or unknown)."""
        return self._dequeue(action_id) is not None

    def bind(self, trajectory: str, resource: str, node: str) -> None:
        self.bindings[(trajectory, resource)] = node

    def unbind(self, trajectory: str) -> None:
        for key in [k for k in self.bindings if k[0] == trajectory]:
            del self.bindings[key]

    # -- decisions -------------------------------------------------------------------------------
    def estimate(self, action: Action, units: int | None = None) -> float:
        return self.profiles.estimate(action, units)

    def view(self) -> ClusterView:
        return ClusterView(self.pools, self.running.values(), self.bindings, self.estimate,
                           self._queued_per_resource.keys(), self.prefer, self.defer)

    def decide(self, now: float) -> list[Assignment]:
        """Ask the policy which queued actions start now; apply and check its answer."""
        if not self.queue:
            return []
        self.decisions += 1
        assignments = self.allocator.allocate(self.view(), self.queue.values(), now)
        for a in assignments:
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
            self.running[act.id] = RunningAction(a, now, now + est)
        return assignments

    def complete(self, action_id: str, now: float, run_s: float | None = None,
                 learn: bool = True) -> RunningAction:
        """Return a finished action's units to the pools and learn from its run time."""
        ra = self.running.pop(action_id)
        a = ra.assignment
        for r, u in a.units.items():
            self.pools[r].release(a.placement[r], u)
        if learn:
            self.profiles.observe(a.action, dict(a.units), now - ra.start if run_s is None
                                  else run_s)
        return ra
