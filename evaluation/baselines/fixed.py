"""`fixed-dop`: FCFS with every elastic action at one fixed degree of parallelism (paper §8,
Fig. 9 ablation: DoP 1, 4, 16); non-elastic actions get their minimum."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from evaluation.baselines.common import at_most, fcfs_fixed
from solvers.registry import register
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import ValidationError


@register("fixed-dop")
@dataclass(frozen=True)
class FixedDop:
    dop: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.dop, bool) or not isinstance(self.dop, int) or self.dop < 1:
            raise ValidationError("allocator.dop", self.dop, "must be an integer >= 1")

    def amounts(self, a: Action) -> dict[str, int]:
        units = dict(a.mins)
        if a.key is not None:
            units[a.key] = at_most(a, a.key, self.dop)
        return units

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        return fcfs_fixed(view, queue, self.amounts)
