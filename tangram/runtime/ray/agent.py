"""The node agent: one Ray actor per machine that owns that machine's CPU and GPU backends.

The central scheduler (`tangram.runtime.ray.cpu.RayCpuManager`) decides how many cores and which
ones; the agent only enforces that grant through an ordinary `managers.cpu.CpuManager` whose one
node is this machine. Ray carries the RPC and pins the agent to its node
(`NodeAffinitySchedulingStrategy(node_id, soft=False)`, `num_cpus=0`); Ray's own CPU resources are
logical and play no part in enforcement.

This module imports no Ray at top level: the class is made a Ray actor by the caller
(`ray.remote(NodeAgent)`), so it stays importable, and testable, without Ray.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from managers.cpu import CpuManager
from managers.cpu.node import local_memory_mb
from managers.gpu import GpuBackend, create_backend
from tangram.allocation import Assignment
from tangram.results import Result
from topology import CpuNode, discover_gpus
from topology.discovery import discover_numa


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What an agent found on its machine; the central pool is built from these."""

    name: str  # the node's name in Tangram's pools and placements
    ray_node_id: str
    numa: Mapping[int, tuple[int, ...]]
    memory_mb: int
    gpus: int
    backend: str

    @property
    def cores(self) -> int:
        return sum(len(c) for c in self.numa.values())


_SLEEP = re.compile(r"^\s*sleep\s+([0-9]*\.?[0-9]+)\s*$")


def sleep_seconds(command: str | Sequence[str], cores: int) -> float:
    """A `sim` duration model for tests and benches: `sleep X` takes X seconds, anything else
    none (the sim backend then answers at once)."""
    text = command if isinstance(command, str) else " ".join(command)
    m = _SLEEP.match(text)
    return float(m.group(1)) if m else 0.0


def _gpu_count() -> int:
    try:
        return len(discover_gpus().gpus)
    except Exception:  # no NVML: no GPU to report
        return 0


def choose_cores(
    numa: Mapping[int, tuple[int, ...]], limit: int | None
) -> dict[int, tuple[int, ...]]:
    """`limit` of this machine's cores (all of them when None or more than it has), filling
    NUMA domains in order so a grant stays within as few domains as possible."""
    if limit is None:
        return dict(numa)
    out: dict[int, tuple[int, ...]] = {}
    left = limit
    for d in sorted(numa):
        if left <= 0:
            break
        take = numa[d][:left]
        out[d] = take
        left -= len(take)
    return out


class NodeAgent:
    """Owns one machine's CPU backend and, when asked, its GPU backend; every method is a Ray
    RPC from the central managers.

    `cores`: the core count: for the `sim` backend the modelled cores (a flat NUMA domain);
    for a real backend how many of this machine's cores (discovered from /sys) the agent
    grants, the CPU resource Ray offers on the node. None: all of them. `memory_mb`: None reads
    /proc/meminfo. `gpu_backend` (`sim`, `torch`, `http`): the backend that restores, evicts and
    invokes services on this machine's GPUs; `gpus` sets the GPU count a `sim` backend models
    (otherwise NVML's count is reported).
    """

    def __init__(
        self,
        name: str,
        ray_node_id: str,
        backend: str = "auto",
        backend_options: Mapping[str, Any] | None = None,
        cores: int | None = None,
        memory_mb: int | None = None,
        gpu_backend: str | None = None,
        gpu_options: Mapping[str, Any] | None = None,
        gpus: int | None = None,
    ) -> None:
        if backend == "sim":
            numa = (
                {0: tuple(range(cores))}
                if cores is not None
                else {d: tuple(c) for d, c in discover_numa().items()}
            )
        else:
            numa = choose_cores({d: tuple(c) for d, c in discover_numa().items()}, cores)
        memory = memory_mb if memory_mb is not None else local_memory_mb()
        self.manager = CpuManager(
            backend,
            backend_options=backend_options,
            nodes={name: CpuNode(name, numa)},
            memory_mb={name: memory},
        )
        self.info = NodeInfo(
            name,
            ray_node_id,
            numa,
            memory,
            gpus if gpus is not None else _gpu_count(),
            str(self.manager.backend_name),
        )
        self.gpu: GpuBackend | None = None
        if gpu_backend is not None:
            self.gpu = create_backend(gpu_backend, **dict(gpu_options or {}))

    async def start(self) -> NodeInfo:
        """Start the node's CPU manager (its backend: chosen here for "auto"; its sweep of what
        dead servers left); what it found, for the central pool."""
        await self.manager.start()
        self.info = dataclasses.replace(self.info, backend=str(self.manager.backend_name))
        return self.info

    def describe(self) -> NodeInfo:
        return self.info

    async def open_env(
        self,
        trajectory: str,
        memory_mb: int,
        network: bool = False,
        layers: Mapping[str, Any] | None = None,
    ) -> str:
        return await self.manager.open_env(
            trajectory, memory_mb, network=network, **dict(layers or {})
        )

    # -- environments' trees (images, forks, snapshots, files: see managers.cpu.roots) -------
    async def fork_env(self, env_id: str, trajectories: list[str]) -> list[str]:
        return await self.manager.fork_env(env_id, trajectories)

    async def snapshot(self, env_id: str) -> str:
        return await self.manager.snapshot(env_id)

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self.manager.delete_snapshot(snapshot_id)

    async def write_files(self, env_id: str, files: Mapping[str, bytes]) -> None:
        await self.manager.write_files(env_id, files)

    async def read_files(self, env_id: str, paths: list[str]) -> dict[str, bytes | None]:
        return await self.manager.read_files(env_id, paths)

    async def close_env(self, env_id: str) -> None:
        await self.manager.close_env(env_id)

    # -- shell sessions (managers.cpu.shells): their commands come as actions (`run`) -------
    async def open_session(self, env_id: str, name: str) -> None:
        await self.manager.open_session(env_id, name)

    async def close_session(self, env_id: str, name: str) -> None:
        await self.manager.close_session(env_id, name)

    async def kernel_command(self, env_id: str) -> str:
        return await self.manager.kernel_command(env_id)

    async def run(self, assignment: Assignment) -> Result:
        """Run one action on exactly the cores the central scheduler granted on this node."""
        return await self.manager.run(assignment)

    # -- GPU services (the central GpuManager decides chunks and residency) --------------------
    def _gpu_backend(self) -> GpuBackend:
        if self.gpu is None:
            raise RuntimeError(f"node {self.info.name} runs no GPU backend")
        return self.gpu

    async def gpu_deploy(self, service: Any) -> None:
        await self._gpu_backend().deploy(service)

    async def gpu_restore(self, service: Any, chunk: tuple[int, int]) -> float:
        return await self._gpu_backend().restore(service, self.info.name, chunk)

    async def gpu_evict(self, service: Any, chunk: tuple[int, int]) -> None:
        await self._gpu_backend().evict(service, self.info.name, chunk)

    async def gpu_invoke(self, service: Any, chunk: tuple[int, int], payload: Any) -> Any:
        return await self._gpu_backend().invoke(service, self.info.name, chunk, payload)

    def gpu_calls(self) -> list[tuple]:
        """What the GPU backend did, where it records it (the `sim` backend does)."""
        return list(getattr(self.gpu, "calls", []))

    async def close(self) -> None:
        await self.manager.close()
        if self.gpu is not None:
            await self.gpu.close()
