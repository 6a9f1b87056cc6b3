"""`k8s`: Kubernetes, one pod per trajectory holding fixed cores for the trajectory's whole
life (paper §7 baseline for AI coding).

A trajectory's pod is created when it begins: the Kubernetes scheduler binds it to the node
with the most unreserved cores (LeastAllocated), at most `pods_per_s` pods a second
(docs/calibration.md §1: about 100 pods/s), and it starts after a lognormal delay (median 1.5 s, p99
5 s, docs/calibration.md §1 defaults). A pod that fits nowhere stays pending until a pod is deleted.
Every action of the trajectory then runs on its pod's cores only, with as many of them as its
demand allows (`pytest -n <pod cores>`), and never on another pod's idle cores.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass, field

from evaluation.baselines.common import NoLifecycle
from evaluation.params import assumed, setting, src
from solvers.registry import register
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import ValidationError
from tangram.pools import CorePool, Placement


@register("k8s")
@dataclass
class Kubernetes(NoLifecycle):
    pod_cores: int = field(
        default=4,
        metadata=assumed("cores per trajectory pod; the paper does not give its pod size", 2, 8),
    )
    start_median_s: float = field(
        default=1.5,
        metadata=src(
            "docs/calibration.md §1: pod start ~2 s on an idle cluster; SLO p99 5 s", 1.0, 2.0
        ),
    )
    start_p99_s: float = field(
        default=5.0, metadata=src("docs/calibration.md §1: pod startup SLO p99 <= 5 s")
    )
    pods_per_s: float = field(
        default=100.0,
        metadata=src(
            "docs/calibration.md §1: ~100 pods/s (API QPS limit); legacy default 50", 50.0, 100.0
        ),
    )
    resource: str = field(default="cpu", metadata=setting("the pool the pods take cores of"))
    seed: int = field(default=0, metadata=setting("random seed"))
    pods: dict[str, tuple[str, tuple[int, ...]]] = field(default_factory=dict, init=False)
    _unreserved: dict[str, set[int]] = field(default_factory=dict, init=False)
    _next_bind: float = field(default=0.0, init=False)
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.pod_cores, int) or self.pod_cores < 1:
            raise ValidationError("allocator.pod_cores", self.pod_cores, "must be >= 1")
        self._rng = random.Random(self.seed)

    def attach(self, pools, executors) -> None:
        pool = pools[self.resource]
        if not isinstance(pool, CorePool):
            raise ValidationError("allocator.resource", self.resource, "k8s needs a core pool")
        self._unreserved = {n: set(pool.cpu_node(n).domain_of) for n in pool.nodes()}

    def start(self, traj, now: float) -> float | None:
        node = max(self._unreserved, key=lambda n: (len(self._unreserved[n]), n), default=None)
        if node is None or len(self._unreserved[node]) < self.pod_cores:
            return None  # pending: no node has room for the pod
        cores = tuple(sorted(self._unreserved[node])[: self.pod_cores])
        self._unreserved[node].difference_update(cores)
        self.pods[traj.id] = (node, cores)
        bind = max(now, self._next_bind)
        self._next_bind = bind + 1.0 / self.pods_per_s
        sigma = math.log(self.start_p99_s / self.start_median_s) / 2.3263
        return bind - now + self.start_median_s * math.exp(self._rng.gauss(0.0, sigma))

    def end(self, traj, now: float) -> None:
        node, cores = self.pods.pop(traj.id)
        self._unreserved[node].update(cores)

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        pool = view.pools[self.resource]
        assert isinstance(pool, CorePool)
        taken: set[tuple[str, int]] = set()
        out = []
        for a in queue:
            pod = self.pods.get(a.trajectory or "")
            if pod is None or set(a.demands) != {self.resource}:
                raise ValidationError(
                    f"action[{a.id}]",
                    a.trajectory,
                    "k8s runs only CPU actions of trajectories with a pod",
                )
            node, cores = pod
            free_sets = pool.cpu_node(node).free
            free = [
                c
                for c in cores
                if (node, c) not in taken and any(c in s for s in free_sets.values())
            ]
            fit = [m for m in a.demands[self.resource].amounts if m <= len(free)]
            if not fit:
                continue
            k = fit[-1]
            got = tuple(free[:k])
            taken.update((node, c) for c in got)
            out.append(
                Assignment(a, {self.resource: k}, {self.resource: Placement(node, cores=got)})
            )
        return out
