"""The executor backend of the GPU manager: how a restore, an evict and an invoke happen.

The pool logic (`Residency`) decides *whether* to restore and *what* to evict; a backend
carries it out. Backends register themselves by name at the bottom of their module
(`register("sim", SimBackend)`); `create_backend(name, **options)` imports the module lazily,
so the runtime never imports torch or an HTTP client it does not use.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from managers.gpu.services import Service
from tangram.errors import BackendUnavailable, ValidationError

Chunk = tuple[int, int]

_MODULES = {
    "sim": "managers.gpu.sim",
    "torch": "managers.gpu.torch_backend",
    "http": "managers.gpu.http_backend",
}
BACKENDS: dict[str, Callable[..., GpuBackend]] = {}


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
    if name in BACKENDS and BACKENDS[name] is not factory:
        raise ValidationError("gpu.backend", name, "registered twice")
    BACKENDS[name] = factory


def create_backend(name: str, **options: Any) -> GpuBackend:
    """The backend registered as `name`; raises `BackendUnavailable` naming the fix."""
    if name not in _MODULES and name not in BACKENDS:
        raise ValidationError("gpu.backend", name, f"unknown (known: {sorted(_MODULES)})")
    if name not in BACKENDS:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError as exc:
            raise BackendUnavailable(f"GPU backend {name!r} cannot load ({exc}); for torch "
                                     "install the extra: pip install 'arl-tangram[gpu]'") from None
    return BACKENDS[name](**options)
