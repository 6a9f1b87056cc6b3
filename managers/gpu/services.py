"""GPU model services (paper 5.3): what a GPU action asks for, registered by name.

A service is a model (a reward model, a judge, a teacher) that GPU actions call. Each DoP it
allows is its own *variant* (the paper treats different DoP configurations as different
services): a variant of `k` GPUs runs on one aligned k-chunk and holds `memory_bytes[k]` on
*each* GPU of that chunk while resident. Restore time of a variant is `restore_s[k]` when it was
measured (or given by an instance file), else bytes over the host-to-GPU bandwidth plus a fixed
latency (`RestoreModel`). Inference time per variant comes from a profile (`infer_s`), which
only the `sim` backend needs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from tangram.errors import ValidationError
from topology import is_pow2

GB = 10**9
"""Bytes per GB: instance files and docs/calibration.md are in decimal GB."""


@dataclass(frozen=True, slots=True)
class RestoreModel:
    """Restore time from bytes: `latency_s + bytes / (bandwidth_gbps * GB)`.

    The default is the practical pinned host-to-device rate of an H100/H200 (about 50 GB/s,
    docs/calibration.md §3) plus the fixed cost of waking a server (0.1 to 0.5 s there).
    Copies to the GPUs of a chunk run in parallel (one link each), so bytes are per GPU.
    """

    bandwidth_gbps: float = 50.0
    latency_s: float = 0.2

    def __post_init__(self) -> None:
        if not self.bandwidth_gbps > 0:
            raise ValidationError("restore.bandwidth_gbps", self.bandwidth_gbps, "must be > 0")
        if not self.latency_s >= 0:
            raise ValidationError("restore.latency_s", self.latency_s, "must be >= 0")

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / (self.bandwidth_gbps * GB)


def _per_dop(
    path: str, table: Mapping[int, float] | None, dops: tuple[int, ...], integer: bool
) -> Mapping[int, float]:
    if table is None:
        return MappingProxyType({})
    out = {}
    for k, v in table.items():
        if k not in dops:
            raise ValidationError(f"{path}[{k}]", v, f"no such DoP variant (allowed: {dops})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise ValidationError(f"{path}[{k}]", v, "must be a number >= 0")
        if integer and (not isinstance(v, int) or v <= 0):
            raise ValidationError(f"{path}[{k}]", v, "must be a positive integer")
        out[k] = v
    return MappingProxyType(out)


@dataclass(frozen=True, slots=True)
class Service:
    """One registered service: per-DoP memory per GPU, and optional restore/inference profiles.

    Build with `Service.uniform` (the same footprint per GPU at every DoP, as in the instance
    file) or `Service.sharded` (weights split across the chunk's GPUs, plus a per-GPU reserve).
    """

    name: str
    memory_bytes: Mapping[int, int]
    restore_s: Mapping[int, float] = field(default_factory=dict)
    infer_s: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError("service.name", self.name, "must be a non-empty string")
        if not self.memory_bytes:
            raise ValidationError(
                f"services.{self.name}.memory_bytes",
                self.memory_bytes,
                "must allow at least one DoP",
            )
        for k in self.memory_bytes:
            if isinstance(k, bool) or not isinstance(k, int) or not is_pow2(k):
                raise ValidationError(
                    f"services.{self.name}.dop",
                    k,
                    "DoP variants are powers of two (one aligned chunk each)",
                )
        dops = tuple(sorted(self.memory_bytes))
        path = f"services.{self.name}"
        object.__setattr__(
            self, "memory_bytes", _per_dop(f"{path}.memory_bytes", self.memory_bytes, dops, True)
        )
        object.__setattr__(
            self, "restore_s", _per_dop(f"{path}.restore_s", self.restore_s, dops, False)
        )
        object.__setattr__(self, "infer_s", _per_dop(f"{path}.infer_s", self.infer_s, dops, False))

    @classmethod
    def uniform(
        cls,
        name: str,
        memory_bytes: int,
        dops: tuple[int, ...] = (1,),
        restore_s: float | None = None,
        infer_s: float | None = None,
    ) -> Service:
        return cls(
            name,
            {k: memory_bytes for k in dops},
            {k: restore_s for k in dops} if restore_s is not None else {},
            {k: infer_s for k in dops} if infer_s is not None else {},
        )

    @classmethod
    def sharded(
        cls,
        name: str,
        weights_bytes: int,
        dops: tuple[int, ...] = (1,),
        reserve_bytes: int = 0,
        infer_s: Mapping[int, float] | None = None,
    ) -> Service:
        """Weights split evenly over k GPUs (tensor parallel) plus `reserve_bytes` per GPU."""
        return cls(
            name, {k: -(-weights_bytes // k) + reserve_bytes for k in dops}, {}, dict(infer_s or {})
        )

    @property
    def dops(self) -> tuple[int, ...]:
        return tuple(sorted(self.memory_bytes))

    def bytes_per_gpu(self, k: int) -> int:
        try:
            return int(self.memory_bytes[k])
        except KeyError:
            raise ValidationError(
                f"services.{self.name}.dop", k, f"no variant of {k} GPUs (allowed: {self.dops})"
            ) from None

    def restore_seconds(self, k: int, model: RestoreModel) -> float:
        """The measured/declared restore time of the k-GPU variant, else from its bytes."""
        if k in self.restore_s:
            return float(self.restore_s[k])
        return model.seconds(self.bytes_per_gpu(k))

    def infer_seconds(self, k: int, default: float = 0.0) -> float:
        return float(self.infer_s.get(k, default))


class ServiceRegistry:
    """Services by name. Registering a name twice is an error (no silent replacement)."""

    def __init__(self, services: Mapping[str, Service] | None = None) -> None:
        self._services: dict[str, Service] = {}
        for s in (services or {}).values():
            self.register(s)

    def register(self, service: Service) -> Service:
        if service.name in self._services:
            raise ValidationError(f"services.{service.name}", service.name, "already registered")
        self._services[service.name] = service
        return service

    def get(self, name: str | None) -> Service:
        if name is None or name not in self._services:
            raise ValidationError(
                "action.service", name, f"unknown service (registered: {sorted(self._services)})"
            )
        return self._services[name]

    def __contains__(self, name: object) -> bool:
        return name in self._services

    def __iter__(self) -> Iterator[Service]:
        return iter(self._services.values())

    def __len__(self) -> int:
        return len(self._services)

    def names(self) -> list[str]:
        return sorted(self._services)
