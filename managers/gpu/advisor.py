"""The placement advisor of a chunk pool, built on its residency cache (`managers.gpu.residency`).

`ResidencyAdvisor.prefer` scores chunk choices by residency (`Residency.prefer`);
`ResidencyAdvisor.defer` makes an action wait for a busy resident copy of its service rather
than restore one (`ResidentWait`, `Residency.should_wait`).
"""

from __future__ import annotations

from managers.gpu.residency import Chunk, Residency
from tangram.actions import Action
from tangram.pools import Placement, PlacementAdvisor


class ResidentWait:
    """`ResidencyAdvisor.defer` for a chunk pool: an action waits for a busy resident copy of its
    service rather than restore one (`Residency.should_wait`). Within one decision (one view)
    it counts the actions already waiting for each copy, so no copy gathers a convoy."""

    def __init__(self, residency: Residency) -> None:
        self.residency = residency
        self._claims: tuple[object, dict[tuple[str, Chunk], int]] = (None, {})

    def __call__(self, action: Action, resource: str, placement, view, now: float) -> bool:
        if placement.chunk is None:
            return False
        if self._claims[0] is not view:  # a new decision: nobody waits for a copy yet
            self._claims = (view, {})
        busy = [
            (
                ra.assignment.placement[resource].node,
                ra.assignment.placement[resource].chunk,
                ra.expected_end,
            )
            for ra in view.running
            if resource in ra.assignment.placement
            and ra.assignment.placement[resource].chunk is not None
        ]
        # the estimate takes units of the action's key: the chunk's size only when the key is
        # this pool (a vector action keyed on its cores is estimated at its own amount)
        k = placement.chunk[1] - placement.chunk[0] if action.key == resource else None
        return self.residency.should_wait(
            action,
            resource,
            placement.node,
            placement.chunk,
            busy,
            now,
            self._claims[1],
            view.estimate(action, k),
        )


class ResidencyAdvisor(PlacementAdvisor):
    """The placement advisor of one chunk pool: prefer the chunk where the action's service is
    resident (`Residency.prefer`), wait for a busy resident copy rather than restore one
    (`ResidentWait`). One per pool, set on the pool by whoever builds it with its residency."""

    def __init__(self, residency: Residency) -> None:
        self.residency = residency
        self.resource = residency.resource
        self.wait = ResidentWait(residency)

    def prefer(self, action: Action, node: str, chunk: tuple[int, int]) -> float:
        return self.residency.prefer(action, self.resource, node, chunk)

    def defer(self, action: Action, placement: Placement, view, now: float) -> bool:
        return self.wait(action, self.resource, placement, view, now)
