"""Estimated free units of a pool over time: what conservative backfilling reserves against.

A timeline starts from the units held now (running actions and this decision's starts, each
until its *estimated* end; one already past its estimate counts as ending now) and takes
reservations: a waiting action's units from its estimated start for its estimated duration.
Two shapes, matching the pools' topologies:

- `CountTimeline` for flat and core pools: free units of one node as a step function (units of
  a node are interchangeable for the estimate);
- `ChunkTimeline` for GPU chunk pools: busy intervals per GPU, so a reservation names one aligned
  chunk and fragmentation is seen, not averaged away.

Both answer the same two questions: `earliest(k, d, t0, node)` (the first estimated time at or
after `t0` when k units are free for d seconds, and where) and `fits_now(...)`, and both `take`
a slot. The first fitting (time, slot) in a fixed order is returned, so adding load never makes
a slot that was chosen earlier become not chosen while it still fits: the property conservative
backfilling rests on.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

EPS = 1e-9

Slot = tuple[str, tuple[int, int] | None]
"""Where a reservation sits: a node, and for chunk pools an aligned chunk (start, end)."""


class CountTimeline:
    """Free units of each node of a flat pool, as a step function of time from `now`."""

    __slots__ = ("now", "_times", "_free")

    def __init__(
        self, now: float, free_now: dict[str, int], releases: Iterable[tuple[str, float, int]]
    ) -> None:
        """`free_now[node]`: units free now; `releases`: (node, estimated end, units) of the
        units held now."""
        self.now = now
        self._times: dict[str, list[float]] = {}
        self._free: dict[str, list[int]] = {}
        steps: dict[str, dict[float, int]] = {n: {} for n in free_now}
        base = dict(free_now)
        for node, end, units in releases:
            if end <= now + EPS:  # past its estimate: counts as ending now
                base[node] += units
            else:
                steps[node][end] = steps[node].get(end, 0) + units
        for node, f in base.items():
            times, free = [now], [f]
            for t in sorted(steps[node]):
                f += steps[node][t]
                times.append(t)
                free.append(f)
            self._times[node], self._free[node] = times, free

    def nodes(self) -> list[str]:
        return list(self._times)

    def _min_free(self, node: str, s: float, e: float) -> int:
        """The fewest units free on `node` at any step of [s, e)."""
        times, free = self._times[node], self._free[node]
        i = bisect.bisect_right(times, s + EPS) - 1
        j = bisect.bisect_left(times, e - EPS, i + 1)  # the first step from e on
        return min(free[i:j])

    def earliest(
        self, k: int, d: float, t0: float, node: str | None = None
    ) -> tuple[float, Slot] | None:
        """First (time >= t0, node) with k units free for d seconds; None if never.

        One pass per node: a window that meets a step with fewer than k free units fails for
        every start up to that step's end, so the next candidate is the step after it."""
        best: tuple[float, Slot] | None = None
        for n in [node] if node is not None else self._times:
            times, free = self._times[n], self._free[n]
            last = len(times) - 1
            i = max(0, bisect.bisect_right(times, t0 + EPS) - 1)
            t = t0
            while best is None or t < best[0] - EPS:
                j = i
                while free[j] >= k:
                    if j == last or times[j + 1] >= t + d - EPS:
                        best = (t, (n, None))
                        break
                    j += 1
                else:
                    if j == last:
                        break  # short of k units for good on this node
                    i = j + 1
                    t = times[i]
                    continue
                break
        return best

    def fits_now(self, k: int, d: float, node: str, now_ok: Callable[[Slot], bool]) -> Slot | None:
        slot = (node, None)
        if now_ok(slot) and self._min_free(node, self.now, self.now + d) >= k:
            return slot
        return None

    def take(self, slot: Slot, k: int, s: float, e: float) -> None:
        node = slot[0]
        times, free = self._times[node], self._free[node]
        for t in (s, e):
            i = bisect.bisect_right(times, t + EPS) - 1
            if abs(times[i] - t) > EPS:
                times.insert(i + 1, t)
                free.insert(i + 1, free[i])
        i = bisect.bisect_right(times, s + EPS) - 1
        while i < len(times) and times[i] < e - EPS:
            free[i] -= k
            i += 1


class ChunkTimeline:
    """Busy intervals of every GPU of a chunk pool; a reservation takes one aligned chunk."""

    __slots__ = ("now", "_busy", "_gpus")

    def __init__(
        self, now: float, gpus: dict[str, int], held: Iterable[tuple[str, tuple[int, int], float]]
    ) -> None:
        """`gpus[node]`: GPUs per node; `held`: (node, chunk, estimated end) held now."""
        self.now = now
        self._gpus = dict(gpus)
        self._busy: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for node, chunk, end in held:
            if end > now + EPS:
                for g in range(*chunk):
                    self._busy.setdefault((node, g), []).append((now, end))

    def nodes(self) -> list[str]:
        return list(self._gpus)

    def _free(self, node: str, chunk: tuple[int, int], s: float, e: float) -> bool:
        for g in range(*chunk):
            for b0, b1 in self._busy.get((node, g), ()):
                if b0 < e - EPS and s < b1 - EPS:
                    return False
        return True

    def _chunks(self, node: str, k: int) -> range:
        return range(0, self._gpus[node] - k + 1, k) if k <= self._gpus[node] else range(0)

    def earliest(
        self, k: int, d: float, t0: float, node: str | None = None
    ) -> tuple[float, Slot] | None:
        nodes = [node] if node is not None else list(self._gpus)
        ends = sorted(
            {
                b1
                for n in nodes
                for g in range(self._gpus[n])
                for _, b1 in self._busy.get((n, g), ())
                if b1 > t0 + EPS
            }
        )
        for t in [t0, *ends]:
            for n in nodes:
                for s in self._chunks(n, k):
                    if self._free(n, (s, s + k), t, t + d):
                        return t, (n, (s, s + k))
        return None

    def fits_now(self, k: int, d: float, node: str, now_ok: Callable[[Slot], bool]) -> Slot | None:
        for s in self._chunks(node, k):
            slot = (node, (s, s + k))
            if self._free(node, (s, s + k), self.now, self.now + d) and now_ok(slot):
                return slot
        return None

    def take(self, slot: Slot, k: int, s: float, e: float) -> None:
        node, chunk = slot
        assert chunk is not None
        for g in range(*chunk):
            self._busy.setdefault((node, g), []).append((s, e))


Timeline = CountTimeline | ChunkTimeline
