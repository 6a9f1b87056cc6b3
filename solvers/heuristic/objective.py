"""The ACT approximation (paper Algorithm 2).

Candidates start now, so their completion is exact given their units. Everything else that
contends for the same pool (the evicted candidates, then the queue behind them) is estimated by
a completion heap seeded with the running actions: each waiting action takes its minimum units
and starts once enough units have come back. `depth` lets the *first* waiting action try more
than its minimum (depth 1: minimum only; depth d >= 2: d amounts evenly spread from its minimum
to its maximum), which is what finds "run them one after another at full width".
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting action as the estimate sees it: options (units, duration), minimum first."""

    options: tuple[tuple[int, float], ...]


def spread(options: tuple[tuple[int, float], ...], depth: int) -> tuple[tuple[int, float], ...]:
    """`depth` options evenly spread over the allowed ones (min and max included)."""
    n = len(options)
    if depth <= 1 or n == 1:
        return options[:1]
    if depth >= n:
        return options
    idx = sorted({round(i * (n - 1) / (depth - 1)) for i in range(depth)})
    return tuple(options[i] for i in idx)


def _fill(
    releases: list[tuple[float, int]],
    free: int,
    now: float,
    first: tuple[int, float] | None,
    rest: list[Waiting],
    capacity: int,
) -> float:
    """Sum of (end - now) of the waiting actions, started in order as units come back.

    `releases` (sorted by time) are the busy units known now; the estimate's own completions
    go to a heap, and the next unit to come back is the earlier of the two.
    """
    total = 0.0
    clock = now
    i, n = 0, len(releases)
    heap: list[tuple[float, int]] = []
    for k, w in enumerate(rest):
        u, d = first if (k == 0 and first is not None) else w.options[0]
        if u > capacity:
            continue
        while free < u:
            if heap and (i >= n or heap[0][0] < releases[i][0]):
                t, back = heapq.heappop(heap)
            elif i < n:
                t, back = releases[i]
                i += 1
            else:  # cannot happen while u <= capacity
                break
            free += back
            if t > clock:
                clock = t
        end = clock + d
        heapq.heappush(heap, (end, u))
        free -= u
        total += end - now
    return total


def estimate_waiting(
    busy: list[tuple[float, int]],
    free: int,
    now: float,
    rest: list[Waiting],
    depth: int,
    capacity: int,
    presorted: bool = False,
) -> float:
    """Best estimated completion sum of `rest` over the first one's `depth` options.

    `busy`: (end time, units) of everything holding units of the pool now (already in
    ascending order when `presorted`).
    """
    if not rest:
        return 0.0
    releases = busy if presorted else sorted(busy)
    best = None
    for opt in spread(rest[0].options, depth):
        v = _fill(releases, free, now, opt, rest, capacity)
        if best is None or v < best:
            best = v
    return best if best is not None else 0.0
