"""What `Tangram.status()` answers: one typed snapshot of the runtime, read by the metrics
collector, served as `GET /v1/status` and parsed back by the client. `to_dict` is the JSON of
the HTTP API (its keys are the field names); `from_dict` inverts it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tangram.errors import ValidationError


@dataclass(frozen=True, slots=True)
class NodeUnits:
    """One node of a pool: its units and how many are free now."""

    capacity: int
    free: int


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One pool (a resource type over its nodes)."""

    capacity: int
    free: int
    nodes: Mapping[str, NodeUnits] = field(default_factory=dict)

    @property
    def busy(self) -> int:
        """Units granted to running actions."""
        return self.capacity - self.free

    @property
    def utilisation(self) -> float:
        return 0.0 if self.capacity == 0 else self.busy / self.capacity

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity": self.capacity,
            "free": self.free,
            "utilisation": self.utilisation,
            "nodes": {n: {"capacity": u.capacity, "free": u.free} for n, u in self.nodes.items()},
        }


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """The runtime now. `gpu_*` are None without a GPU manager, `cpu_backend` without a CPU
    one; `api_throttled`: calls flow control held back, per API; `api_window`: the in-flight
    limit flow control learned, per API that learns one; `closing`: shutting down."""

    policy: str
    pools: Mapping[str, PoolStatus]
    queue: int
    running: int
    envs: int
    cpu_backend: str | None = None
    cpu_isolates: bool | None = None  # False: commands share the host (cgroup, affinity)
    gpu_backend: str | None = None
    gpu_simulated: bool | None = None
    gpu_pool: str | None = None
    cpu_lost: str | None = None  # what the CPU backend does not guarantee here (not root...)
    api_throttled: Mapping[str, int] = field(default_factory=dict)
    api_window: Mapping[str, int] = field(default_factory=dict)
    closing: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `GET /v1/status`."""
        return {
            "policy": self.policy,
            "pools": {r: p.to_dict() for r, p in self.pools.items()},
            "queue": self.queue,
            "running": self.running,
            "envs": self.envs,
            "cpu_backend": self.cpu_backend,
            "cpu_isolates": self.cpu_isolates,
            "gpu_backend": self.gpu_backend,
            "gpu_simulated": self.gpu_simulated,
            "gpu_pool": self.gpu_pool,
            "cpu_lost": self.cpu_lost,
            "api_throttled": dict(self.api_throttled),
            "api_window": dict(self.api_window),
            "closing": self.closing,
        }

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> StatusSnapshot:
        """`to_dict`'s inverse (what the client reads); `ValidationError` naming the field
        that is missing or malformed. Keys it does not know are ignored (a newer server)."""
        try:
            pools = {
                r: PoolStatus(
                    int(p["capacity"]),
                    int(p["free"]),
                    {
                        n: NodeUnits(int(u["capacity"]), int(u["free"]))
                        for n, u in (p.get("nodes") or {}).items()
                    },
                )
                for r, p in doc["pools"].items()
            }
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ValidationError("status.pools", doc.get("pools"), "not a pool table") from None
        for name in ("policy", "queue", "running", "envs"):
            if name not in doc:
                raise ValidationError(f"status.{name}", None, "missing")
        return cls(
            str(doc["policy"]),
            pools,
            int(doc["queue"]),
            int(doc["running"]),
            int(doc["envs"]),
            doc.get("cpu_backend"),
            doc.get("cpu_isolates"),
            doc.get("gpu_backend"),
            doc.get("gpu_simulated"),
            doc.get("gpu_pool"),
            doc.get("cpu_lost"),
            dict(doc.get("api_throttled") or {}),
            dict(doc.get("api_window") or {}),
            bool(doc.get("closing", False)),
        )
