"""Prometheus metrics of one Tangram instance (its own registry, so two instances never mix)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from tangram.results import Status
from tangram.runtime.status import StatusSnapshot

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)


class _PoolCollector:
    def __init__(self, snapshot: Callable[[], StatusSnapshot]) -> None:
        self.snapshot = snapshot

    def collect(self):
        s = self.snapshot()
        busy = GaugeMetricFamily(
            "tangram_units_busy", "units granted to running actions", labels=["pool"]
        )
        cap = GaugeMetricFamily("tangram_units_capacity", "units of the pool", labels=["pool"])
        for name, p in s.pools.items():
            busy.add_metric([name], p.busy)
            cap.add_metric([name], p.capacity)
        yield busy
        yield cap
        q = GaugeMetricFamily("tangram_queue_length", "actions waiting for resources")
        q.add_metric([], s.queue)
        yield q
        r = GaugeMetricFamily("tangram_running", "actions running")
        r.add_metric([], s.running)
        yield r
        thr = GaugeMetricFamily(
            "tangram_api_throttled_total", "API calls delayed by flow control", labels=["api"]
        )
        for api, n in s.api_throttled.items():
            thr.add_metric([api], n)
        yield thr


class Metrics:
    def __init__(self, snapshot: Callable[[], StatusSnapshot]) -> None:
        self.registry = CollectorRegistry()
        self.act = Histogram(
            "tangram_act_seconds",
            "action completion time (queued + run)",
            ["kind"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.queued = Histogram(
            "tangram_queued_seconds",
            "time from submission to start",
            ["kind"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.actions = Counter(
            "tangram_actions", "finished actions", ["kind", "status"], registry=self.registry
        )
        self.restores = Counter(
            "tangram_restores", "GPU service restores", ["service"], registry=self.registry
        )
        self.registry.register(_PoolCollector(snapshot))
        # each (kind, status)'s children, found once: `labels` locks and builds its key per call
        self._children: dict[tuple[str, Status], tuple[Any, Any, Any]] = {}

    def observe(self, kind: str, status: Status, queued_s: float, act_s: float) -> None:
        children = self._children.get((kind, status))
        if children is None:
            children = self._children[kind, status] = (
                self.actions.labels(kind, str(status)),
                self.queued.labels(kind),
                self.act.labels(kind),
            )
        done, queued, act = children
        done.inc()
        queued.observe(queued_s)
        act.observe(act_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
