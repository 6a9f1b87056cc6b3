"""When a scoped scheduler re-reads a queue class whose first action the policy put off by
choice (docs/scale.md, "Scoped decisions").

A put-off action waits for more units of its node. Nothing on the node changes until an event
touches it (an arrival, a completion, a cancel: those put the class in the next scope anyway)
or until the time passes the estimated end of something running there, which moves the
estimate's releases. Reading the class at every decision in between, as an unscoped decision
does, costs the number of put-off classes times the whole cluster's decision rate: quadratic
in the cluster's size, and at batch 8,192 most of the scheduler's CPU (issue 28). So the class
is re-read at the first decision at or after the earliest estimated end running on it
(`due`), or at the next decision when everything running there has passed its estimated end.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

Class = tuple[str, str | None]


class Rereads:
    """Classes waiting to be re-read, each with the time it is due (the last `due` wins)."""

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._at: dict[Class, float] = {}
        self._heap: list[tuple[float, str, str, Class]] = []

    def __bool__(self) -> bool:
        return bool(self._at)

    def due(self, c: Class, t: float) -> None:
        self._at[c] = t
        heapq.heappush(self._heap, (t, c[0], c[1] or "", c))

    def drop(self, classes: Iterable[Class]) -> None:
        """These classes are read now: what they were due for is moot."""
        at = self._at
        for c in classes:
            at.pop(c, None)

    def take(self, now: float) -> list[Class]:
        """The classes due by `now` (removed)."""
        heap, at, out = self._heap, self._at, []
        while heap and heap[0][0] <= now:
            t, _, _, c = heapq.heappop(heap)
            if at.get(c) == t:
                del at[c]
                out.append(c)
        if not at:
            heap.clear()
        return out

    def next_due(self) -> float | None:
        """The earliest time a class is due (None: none is)."""
        heap, at = self._heap, self._at
        while heap and at.get(heap[0][3]) != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None
