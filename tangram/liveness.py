"""The scheduler's liveness rule (`tangram.scheduler`, docs/architecture.md, "Liveness"): when
nothing at all is running, the first queued action that fits at its minimum starts."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import Infeasible
from tangram.pools import Placement, Pool
from tangram.queue import ActionQueue


def rescue(
    pools: Mapping[str, Pool],
    queue: ActionQueue,
    node_of: Callable[[Action, str], str | None],
) -> Assignment | None:
    """The first queued action that fits at its minimum on the idle pools, at the amount of
    its key resource with the shortest estimated duration that fits (its minimum when not
    elastic); None when nothing fits (then nothing can ever start: admission prevents it)."""
    for act in queue:
        placement: dict[str, Placement] = {}
        units: dict[str, int] = {}
        for r, k in act.mins.items():
            pool = pools[r].copy()  # `place` takes the units: choose on a copy
            node = node_of(act, r)
            amounts = [k]
            if r == act.key:  # the fastest amount that the free units hold, else the minimum
                free = pool.free(node)
                fast = min(((d, m) for m, d in act.options if m <= free), default=None)
                if fast is not None and fast[1] != k:
                    amounts.insert(0, fast[1])
            for amount in amounts:
                try:
                    placement[r] = pool.place(amount, node)
                except Infeasible:
                    continue
                units[r] = amount
                break
            else:
                break
        if len(units) == len(act.mins):
            return Assignment(act, units, placement)
    return None
