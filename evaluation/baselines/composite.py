"""`by-resource`: route each queued action to the policy of its resource family, so a
workload's baseline can combine per-resource baselines (DeepSearch: API calls with retries,
a static judge). Routes must not share a resource."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from solvers.registry import register
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView, IdleByDesign
from tangram.errors import ValidationError


@register("by-resource")
@dataclass(frozen=True)
class ByResource(IdleByDesign):
    routes: tuple[tuple[str, Any], ...] = ()
    """(resource-name prefix, allocator), first match wins."""

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        parts: list[list[Action]] = [[] for _ in self.routes]
        for a in queue:
            for i, (prefix, _) in enumerate(self.routes):
                if any(r.startswith(prefix) for r in a.demands):
                    parts[i].append(a)
                    break
            else:
                raise ValidationError(
                    f"action[{a.id}].demands", sorted(a.demands), "no route for these resources"
                )
        out: list[Assignment] = []
        for (_, alloc), part in zip(self.routes, parts):
            if part:
                out.extend(alloc.allocate(view, part, now))
        return out
