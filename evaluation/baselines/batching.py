"""Continuous batching for the static (SGLang-style) baseline: a deployed replica serves up to
`max_batch` concurrent calls, as SGLang and vLLM do, instead of one at a time.

The GPU pool holds one chunk per action, so a replica that batches `b` calls is `b` *lanes*:
the pool's nodes are cloned `max_batch` times (lane j of node i is node `j * nodes + i`), every
replica is pinned on each lane, and `BatchedReplicas` stretches a call that joins `n - 1`
others on the same physical replica to `n / S(n)` times its alone duration, S(n) being the
replica's throughput at batch n over its throughput alone (`THROUGHPUT`, docs/calibration.md
§3a). Only the joining call is stretched, not the ones already running (an approximation of
continuous batching, where every member slows a little); with S(n) = n nothing slows, with
S(n) = 1 the n-th call waits for the n - 1 before it, as first come first served would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from evaluation.baselines.gpu import StaticServices, pin_services
from evaluation.params import assumed
from evaluation.simulator import SimExecutor, modelled_duration
from evaluation.workloads.base import Workload
from managers.gpu.sim import SimServiceModel
from tangram.allocation import Assignment

Curve = Callable[[int], float]  # batch size -> throughput over the throughput alone


def prefill_bound(n: int) -> float:
    """Sarathi-Serve (Agrawal et al., OSDI 2024, arXiv 2403.02310, section 3): once a batch
    holds a few hundred prompt tokens, prefill is compute-bound and its time grows linearly with
    the tokens; a 16k-token log-prob call is far past that, so batching adds no throughput."""
    return 1.0


DECODE_C = (10 / (853 / 211) - 1) / 9
"""Millstone's benchmark (docs/calibration.md §6, paper/CALIBRATION.md §6): Qwen3-Coder-Next
FP8 on one H200, 211 tok/s for one stream, 853 tok/s at 10 concurrent (4.04x); S(n) =
n / (1 + c (n - 1)) through that point gives c = 0.164."""


def decode_bound(n: int) -> float:
    return n / (1.0 + DECODE_C * (n - 1))


THROUGHPUT: dict[str, Curve] = {"logprob": prefill_bound, "judge": decode_bound}


@dataclass
class BatchingParams:
    max_batch: int = field(
        default=8,
        metadata=assumed(
            "concurrent calls one static replica serves (SGLang's --max-running-requests is far "
            "larger; 8 covers the bursts here)",
            4,
            16,
        ),
    )


def lanes(w: Workload, max_batch: int) -> Workload:
    """`w` with its GPU nodes cloned `max_batch` times (the lanes of the batching replicas)."""
    spec = w.gpu
    assert spec is not None
    wide = dataclasses.replace(spec, nodes=spec.nodes * max_batch)
    base = w.make_pools

    def pools():
        return {**base(), spec.name: wide.build_pool()}

    return dataclasses.replace(w, gpu=wide, make_pools=pools)


def batched_static(
    w: Workload, services: Sequence[str], gpus_each: int, replicas: int = 1, max_batch: int = 8
) -> tuple[Workload, StaticServices, Callable]:
    """The lane workload, the static allocator pinned on every lane, and its executors."""
    spec = w.gpu
    assert spec is not None
    physical = spec.node_names()
    pins = pin_services(services, physical, spec.gpus_per_node, gpus_each, replicas)
    wide = lanes(w, max_batch)
    names = wide.gpu.node_names()
    n = spec.nodes
    lane_pins = tuple(
        (s, names[j * n + physical.index(node)], a, b)
        for j in range(max_batch)
        for s, node, a, b in pins
    )
    replica_of = {names[j * n + i]: physical[i] for j in range(max_batch) for i in range(n)}
    truth = {s.action.id: s.action for t in w.trajectories for s in t.steps}

    def executors(workload: Workload) -> dict[str, SimExecutor]:
        assert workload.gpu is not None
        return {
            workload.gpu.name: BatchedReplicas(SimServiceModel(workload.gpu), replica_of, truth)
        }

    return wide, StaticServices(pins=lane_pins), executors


@dataclass
class BatchedReplicas:
    """The service model plus the batching stretch per physical replica (node, chunk)."""

    model: SimServiceModel
    replica_of: Mapping[str, str]  # lane node -> physical node
    truth: Mapping[str, object]
    running: dict[tuple[str, int, int], int] = field(default_factory=dict)
    batched: int = 0  # calls that joined a running batch

    @property
    def residency(self):
        """The wrapped model's cache (static deployments warm it before the run)."""
        return self.model.residency

    def _key(self, a: Assignment) -> tuple[str, int, int]:
        p = a.placement[self.model.resource]
        lo, hi = p.chunk
        return self.replica_of[p.node], lo, hi

    def begin(self, a: Assignment, now: float) -> tuple[float, bool]:
        extra, restored = self.model.begin(a, now)
        key = self._key(a)
        n = self.running.get(key, 0) + 1
        self.running[key] = n
        if n > 1:
            self.batched += 1
            curve = THROUGHPUT.get(a.action.kind, prefill_bound)
            alone = modelled_duration(self.truth[a.action.id], a.units)  # type: ignore[arg-type]
            extra += alone * (n / curve(n) - 1.0)
        return extra, restored

    def end(self, a: Assignment, now: float) -> None:
        self.model.end(a, now)
        self.running[self._key(a)] -= 1
