"""`min`: FCFS at minimum amounts, no elasticity (the baseline the heuristic must beat)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from solvers.fcfs import ScratchPools, scan_candidates
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView


@dataclass(frozen=True)
class MinAllocator:
    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        cands = scan_candidates(view, queue, ScratchPools(view.pools), now)
        return [Assignment(c.action, c.units, c.placement) for c in cands]
