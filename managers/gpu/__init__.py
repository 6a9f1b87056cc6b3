"""GPU manager, evict-on-execution (paper 5.3).

- `services`: services and their DoP variants, the registry, the restore-time model;
- `residency`: the pure residency cache (memory accounting, LRU eviction, chunk preference);
- `manager`: `GpuManager`, which runs placed service actions through a backend;
- backends registered by name (`backend.create_backend`): `sim`, `torch` (needs the `gpu`
  extra), `http` (SGLang / vLLM servers that release and resume GPU memory);
- `sim.SimServiceModel`: the simulator's view of the same residency logic;
- `discovery`: NVML GPUs as chunk trees.
"""

from managers.gpu.backend import BACKENDS, GpuBackend, create_backend, register
from managers.gpu.manager import GpuManager
from managers.gpu.residency import Entry, EvictionOrder, RandomEviction, Residency, RestoreDecision
from managers.gpu.services import GB, RestoreModel, Service, ServiceRegistry
from tangram.errors import NodeLost  # re-exported: what a GPU backend raises for a lost node

__all__ = [
    "BACKENDS",
    "GB",
    "Entry",
    "EvictionOrder",
    "GpuBackend",
    "GpuManager",
    "NodeLost",
    "RandomEviction",
    "Residency",
    "RestoreDecision",
    "RestoreModel",
    "Service",
    "ServiceRegistry",
    "create_backend",
    "register",
]
