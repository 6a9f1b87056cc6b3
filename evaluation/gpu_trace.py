"""A first-come-first-served driver of service actions over one chunk pool (virtual clock).

Shared by the hand-worked scenario tests and the benchmark's bursty trace: actions (each one
service call of a fixed DoP) start in arrival order as soon as a chunk is free, placed by
`ChunkPool.place` with or without the residency preference; each runs `restore_s + infer_s`.
It is not the project's simulator (`evaluation.engine` drives the real scheduler); it isolates
the GPU pool logic so restores can be counted under different placement and eviction policies,
and it lives in the evaluation, not among the managers: no driver ships inside `managers/`.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from managers.gpu.residency import Residency
from tangram.actions import Action
from tangram.pools import ChunkPool, Placement


@dataclass(frozen=True, slots=True)
class ServedAction:
    id: str
    service: str
    node: str
    chunk: tuple[int, int]
    start: float
    end: float
    restored: bool
    evicted: tuple[str, ...]


def serve(actions: Iterable[Action], pool: ChunkPool, residency: Residency,
          prefer: bool = True, default_infer_s: float = 1.0) -> list[ServedAction]:
    """Run every action (a GPU demand of one amount on `pool.resource`, a `service`) FCFS.

    An action's duration is its own `duration`, else its service's profiled inference time,
    else `default_infer_s`. Returns one record per action, in start order.
    """
    queue = sorted(actions, key=lambda a: a.submit_time)
    running: list[tuple[float, int, Action, Placement]] = []  # placements hold chunks
    served: list[ServedAction] = []
    now, seq = 0.0, itertools.count()
    res = pool.resource
    for action in queue:
        now = max(now, action.submit_time)
        k = action.demands[res].min
        while True:
            while running and running[0][0] <= now:
                end, _, done, where = heapq.heappop(running)
                residency.end(done, where.node, chunk_of(where), end)
                pool.release(where, k_of(done, res))
            if pool.fits(k) is not None:
                break
            now = running[0][0]
        score = (lambda n, c, a=action: residency.prefer(a, res, n, c)) if prefer else None
        where = pool.place(k, prefer=score)
        d = residency.begin(action, where.node, chunk_of(where), now)
        service = residency.registry.get(action.service)
        run_s = action.duration or service.infer_seconds(k, default_infer_s)
        end = now + d.restore_s + run_s
        heapq.heappush(running, (end, next(seq), action, where))
        served.append(ServedAction(action.id, service.name, where.node, chunk_of(where), now, end,
                                   d.restored, tuple(e.service for e in d.evicted)))
    for end, _, done, where in sorted(running, key=lambda r: (r[0], r[1])):
        residency.end(done, where.node, chunk_of(where), end)
        pool.release(where, k_of(done, res))
    return served


def k_of(action: Action, resource: str) -> int:
    return action.demands[resource].min


def chunk_of(placement: Placement) -> tuple[int, int]:
    if placement.chunk is None:
        raise ValueError(f"placement on {placement.node} has no chunk")
    return placement.chunk
