"""`api-retry`: each trajectory calls the quota-limited API itself (paper §7 DeepSearch
baseline). A call that finds the API at its limit is answered 429 after `reject_s` and retried
with exponential backoff and jitter; calls are never queued in order, so a freed slot goes to
whichever client retries first. `rejections` counts the 429 answers.

The limit is the API pool's capacity (its concurrency); every refused attempt is also counted
at the simulated API server (`evaluation.upstream`), where Tangram's calls are counted too.
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass, field

from evaluation.baselines.common import NoLifecycle
from evaluation.params import assumed, setting
from evaluation.upstream import ApiUpstream
from solvers.fcfs import ScratchPools
from solvers.registry import register
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import Infeasible


@register("api-retry")
@dataclass
class ApiRetry(NoLifecycle):
    reject_s: float = field(
        default=0.1, metadata=assumed("time to receive a 429 (one round trip)", 0.05, 1.0)
    )
    backoff_s: float = field(
        default=1.0,
        metadata=assumed("first retry delay of the client's exponential backoff", 0.5, 4.0),
    )
    backoff_cap_s: float = field(default=30.0, metadata=assumed("backoff cap", 10.0, 60.0))
    jitter: float = field(
        default=0.5, metadata=assumed("random share added to a backoff", 0.0, 1.0)
    )
    seed: int = field(default=0, metadata=setting("random seed"))
    rejections: int = field(default=0, init=False)
    _next: dict[str, float] = field(default_factory=dict, init=False)
    _tries: dict[str, int] = field(default_factory=dict, init=False)
    _rng: random.Random = field(init=False)
    _servers: dict[str, ApiUpstream] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def attach(self, pools, executors) -> None:
        """Each refused attempt reached its API server: the server counts it too."""
        self._servers = {r: e for r, e in executors.items() if isinstance(e, ApiUpstream)}

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        pools = ScratchPools(view.pools)
        out = []
        for a in queue:
            due = self._next.get(a.id, a.submit_time)
            if due > now + 1e-9:
                continue
            units = dict(a.mins)
            placed = {}
            try:
                for r, k in units.items():
                    placed[r] = pools[r].place(k)
            except Infeasible:
                for r, p in placed.items():
                    pools[r].release(p, units[r])
                self.rejections += 1
                for r in units:
                    if r in self._servers:
                        self._servers[r].refuse(r, now)
                n = self._tries.get(a.id, 0)
                self._tries[a.id] = n + 1
                wait = min(self.backoff_cap_s, self.backoff_s * 2**n)
                self._next[a.id] = (
                    now + self.reject_s + wait * (1 + self.jitter * self._rng.random())
                )
                continue
            self._next.pop(a.id, None)
            self._tries.pop(a.id, None)
            out.append(Assignment(a, units, placed))
        return out

    def wakeup(self, now: float) -> float | None:
        return min((t for t in self._next.values() if t > now), default=None)
