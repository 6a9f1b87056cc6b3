"""The allocation interface shared by every policy (heuristic, exact, baselines).

`Allocator.allocate(view, queue, now) -> list[Assignment]`: the policy reads a snapshot of the
pools, the running actions and the queue, and answers which actions start now with how many
units of each resource and where. The scheduler applies the answer through the pools, which
check every invariant (`check_assignments`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from tangram.actions import Action
from tangram.errors import InvariantError
from tangram.pools import Placement, PlacementAdvisor, Pool


@dataclass(frozen=True, slots=True, eq=False)
class Assignment:
    """Action `action` starts now with `units[r]` of each resource r, placed at `placement[r]`."""

    action: Action
    units: Mapping[str, int]
    placement: Mapping[str, Placement]

    @property
    def action_id(self) -> str:
        return self.action.id


@dataclass(frozen=True, slots=True, eq=False)
class RunningAction:
    assignment: Assignment
    start: float
    expected_end: float


def default_estimate(action: Action, units: int | None = None) -> float:
    d = action.duration_at(units)
    return 1.0 if d is None else d


@dataclass(frozen=True, slots=True, eq=False)
class ClusterView:
    """What a policy may read. `pools` must not be mutated: copy a pool before trying things.

    `bindings[(trajectory, resource)]` names the node a trajectory's environment lives on (CPU
    actions of a trajectory stay on its node). `estimate(action, units)` is the duration model
    (the action's own, else the learned profile of its kind).
    """

    pools: Mapping[str, Pool]
    running: Collection[RunningAction] = ()
    bindings: Mapping[tuple[str, str], str] = field(default_factory=lambda: MappingProxyType({}))
    estimate: Callable[[Action, int | None], float] = default_estimate
    queued_resources: Collection[str] | None = None
    """Resources some queued action demands (None: assume all); lets scans stop early."""
    scope: Collection[tuple[str, str | None]] | None = None
    """Scoped decisions (`Scheduler(scoped=True)`): the queue classes (resource, node) whose
    state changed since the last decision; a queue-order policy scans only those. None: all."""
    holding: Callable[[str, str | None], Collection[RunningAction]] | None = None
    """(resource, node) -> the running actions holding units of that resource on that node
    (node None: on any node); the scheduler keeps it indexed so that a policy need not walk
    every running action of the cluster for one node's decision. None: filter `running`."""

    def advisor(self, resource: str) -> PlacementAdvisor | None:
        """The pool's placement advisor (`tangram.pools.PlacementAdvisor`), or None."""
        return self.pools[resource].advisor

    def node_for(self, action: Action, resource: str) -> str | None:
        if action.trajectory is None:
            return None
        return self.bindings.get((action.trajectory, resource))

    def running_on(self, resource: str, node: str | None = None) -> Collection[RunningAction]:
        """The running actions holding units of `resource` (on `node` when given)."""
        if self.holding is not None:
            return self.holding(resource, node)
        return [
            ra
            for ra in self.running
            if ra.assignment.units.get(resource)
            and (node is None or ra.assignment.placement[resource].node == node)
        ]


class Allocator(Protocol):
    """Every policy implements this one method; nothing branches on which policy it is."""

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]: ...


class IdleByDesign:
    """Marks a policy that models a system which keeps units idle by design (the evaluation's
    baselines: Kubernetes pods holding cores for a trajectory's life, GPUs pinned to one
    service). The scheduler does not impose work conservation on its decisions
    (`tangram.conservation`): that would model a different system. The liveness rule holds for
    every policy."""


class SlowPolicy:
    """Marks a policy whose decision may take long (a solver with a time limit: the exact
    policies). The runtime runs its decisions in a worker thread, off the event loop, so no
    client waits on the solver (`tangram.runtime.decisions`); a policy not marked is moved off
    the loop too once one of its decisions is measured slow."""


def check_assignment_shape(
    a: Assignment, pools: Mapping[str, Pool], bindings: Mapping[tuple[str, str], str] | None = None
) -> None:
    """Amounts among the allowed ones, a placement per demanded resource, bound nodes kept."""
    act = a.action
    if set(a.units) != set(act.demands) or set(a.placement) != set(act.demands):
        raise InvariantError(
            f"action {act.id}: assignment covers {sorted(a.units)} / {sorted(a.placement)}, "
            f"demands are {sorted(act.demands)}"
        )
    for r, u in a.units.items():
        if not act.demands[r].allows(u):
            raise InvariantError(
                f"action {act.id}: {u} units of {r} not among {act.demands[r].amounts}"
            )
        if r not in pools:
            raise InvariantError(f"action {act.id}: no pool for resource {r!r}")
        if bindings and act.trajectory is not None:
            node = bindings.get((act.trajectory, r))
            if node is not None and a.placement[r].node != node:
                raise InvariantError(
                    f"action {act.id}: placed on {a.placement[r].node}, its "
                    f"trajectory is bound to {node}"
                )


def check_assignments(
    pools: Mapping[str, Pool],
    assignments: Collection[Assignment],
    bindings: Mapping[tuple[str, str], str] | None = None,
    apply: bool = False,
) -> None:
    """The one invariant checker: the scheduler, the exact solvers and the tests call it.

    Takes every placement into the pools (copies unless `apply`): a pool refuses a unit that is
    over capacity, a core or GPU already in use, or an unaligned chunk. Raises `InvariantError`.
    """
    work = pools if apply else {r: p.copy() for r, p in pools.items()}
    seen: set[str] = set()
    for a in assignments:
        if a.action.id in seen:
            raise InvariantError(f"action {a.action.id} assigned twice in one decision")
        seen.add(a.action.id)
        check_assignment_shape(a, work, bindings)
        for r, u in a.units.items():
            try:
                work[r].take(a.placement[r], u)
            except Exception as exc:
                raise InvariantError(f"action {a.action.id}: {r}: {exc}") from exc
