"""The executor backend of the GPU manager: how a restore, an evict and an invoke happen.

The pool logic (`Residency`) decides *whether* to restore and *what* to evict; a backend
carries it out. Backends are found by name through a `tangram.registry.Registry`: the built-ins
as lazy paths below, third parties' as entry points of the group `tangram.gpu_backends`,
run-time ones through `register`; `create_backend(name, **options)` imports only the chosen
backend's module, so the runtime never imports torch or an HTTP client it does not use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from managers.gpu.services import Service
from tangram.errors import BackendUnavailable, ValidationError
from tangram.registry import Registry

Chunk = tuple[int, int]

BACKENDS: Registry[Callable[..., GpuBackend]] = Registry(
    "gpu.backend",
    {
        "sim": "managers.gpu.sim:SimGpuBackend",
        "torch": "managers.gpu.torch_backend:TorchBackend",
        "http": "managers.gpu.http_backend:HttpBackend",
    },
    group="tangram.gpu_backends",
)


class GpuBackend(ABC):
    """Side effects of the GPU manager. Calls for one chunk never overlap (the scheduler runs
    at most one action per GPU); calls for different chunks may run concurrently."""

    name: str = "backend"

    async def deploy(self, service: Service) -> None:
        """Start-up: make the service's host copy (weights in host memory, or a server that
        has been put to sleep). Nothing is resident on a GPU afterwards."""

    @abstractmethod
    async def restore(self, service: Service, node: str, chunk: Chunk) -> float:
        """Make the `chunk`-sized variant resident on `chunk`; return the seconds it took."""

    @abstractmethod
    async def evict(self, service: Service, node: str, chunk: Chunk) -> None:
        """Free the variant's GPU memory on `chunk`; nothing is written back."""

    @abstractmethod
    async def invoke(self, service: Service, node: str, chunk: Chunk, payload: Any) -> Any:
        """Run one request (JSON in) on the resident variant; return the JSON response."""

    async def close(self) -> None:
        """Release everything; idempotent."""


def register(name: str, factory: Callable[..., GpuBackend]) -> None:
    """Add a backend made at run time (a user's own, a test's)."""
    try:
        BACKENDS.register(name, factory)
    except ValueError:
        raise ValidationError("gpu.backend", name, "registered twice") from None


def create_backend(name: str, **options: Any) -> GpuBackend:
    """The backend registered as `name`; raises `BackendUnavailable` naming the fix."""
    if name not in BACKENDS:
        raise ValidationError("gpu.backend", name, f"unknown (known: {BACKENDS.names()})")
    try:
        factory = BACKENDS.get(name)
    except ImportError as exc:
        raise BackendUnavailable(
            f"GPU backend {name!r} cannot load ({exc}); for torch "
            "install the extra: pip install 'arl-tangram[gpu]'"
        ) from None
    assert factory is not None
    return factory(**options)
