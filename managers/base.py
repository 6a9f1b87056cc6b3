"""The manager interface (paper 5): what the runtime needs from every manager.

A manager owns the pools of some resource types and runs the actions placed on them. Two things
sit behind it: the *pool logic* (which units are free, placement, caches) which is pure and shared
by simulation and production, and an *executor backend* that does the side effects (a process in
a cgroup, a container exec, a GPU restore, an HTTP request) or, for `sim`, only models time.

The scheduler decides *how many units and where* (an `Assignment`); the manager then enforces
exactly that grant while the action runs and returns a `tangram.results.Result` (the runtime
adds the grant and the timings to that same record).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import CorePool, Pool
from tangram.results import Result

if TYPE_CHECKING:
    from managers.cpu.environments import EnvironmentTable


class Manager(ABC):
    """Owns the pools of its resource types; runs actions placed on them."""

    name: str = "manager"

    @property
    def backend_name(self) -> str | None:
        """The executor backend's name (`bwrap`, `cgroup`, `ray:sim`, `torch`, ...); None for
        a manager without one."""
        return None

    @abstractmethod
    def pools(self) -> Mapping[str, Pool]:
        """Pool state objects; the scheduler applies assignments to these very objects."""

    @abstractmethod
    async def run(self, assignment: Assignment) -> Result:
        """Run one placed action, enforcing exactly its granted units; never raise for the
        action's own failure (that is a `Result` whose status says so)."""

    async def start(self) -> None:
        """Begin serving (deploy services, watch membership); the runtime awaits it once
        before the first action. Idempotent; nothing to do by default."""

    async def close(self) -> None:
        """Release everything (processes, cgroups, containers). Idempotent."""


class EnvironmentManager(Manager):
    """A manager of per-trajectory environments (the CPU manager, locally or over Ray): a
    trajectory's commands run in its environment, on the node the environment is bound to.
    It owns one core pool (`pool`, of resource `resource`) and one executor `backend`."""

    resource: str = "cpu"
    pool: CorePool
    backend: Any  # has a `name`: a `managers.cpu.backends.Backend`, or Ray's stand-in
    envs: EnvironmentTable  # the one record of its environments and where they live

    @property
    def trajectory_nodes(self) -> Mapping[str, str]:
        """trajectory -> node of this manager's environments, live: what the scheduler reads
        for its bindings (`tangram.bindings.Bindings.attach`), never a copy."""
        return self.envs.nodes

    @property
    def backend_name(self) -> str | None:
        return self.backend.name

    @property
    def isolates(self) -> bool | None:
        """Whether a command cannot see or reach the host or another environment (the
        backend's `isolates`); None where the backend does not say (Ray's stand-in)."""
        return getattr(self.backend, "isolates", None)

    def pools(self) -> Mapping[str, Pool]:
        return {self.resource: self.pool}

    @abstractmethod
    async def open_env(self, trajectory: str, memory_mb: int, network: bool = False) -> str:
        """Create the trajectory's environment (work dir, memory reservation, no network unless
        `network` where the backend isolates) on some node and bind the trajectory there;
        return the environment's id. At most one per trajectory."""

    @abstractmethod
    async def close_env(self, env_id: str) -> None:
        """Kill whatever still runs in the environment and remove it; its memory returns."""

    def gpus_refused(self) -> str | None:
        """Why this manager's commands cannot be granted GPUs (a vector exec is refused at
        submission, naming `gpus`), None where they can or where only the node knows."""
        refused = getattr(self.backend, "gpus_refused", None)
        return refused if isinstance(refused, str) else None

    @abstractmethod
    def binding(self, trajectory: str) -> str | None:
        """The node the trajectory's environment is bound to (its actions run only there), or
        None when it has none."""

    # -- environments with a tree of their own (images, layers; see managers.cpu.roots) -------
    def _no_layers(self, field: str, value: Any) -> ValidationError:
        return ValidationError(
            field,
            value,
            f"the {self.backend_name} backend has no images, layers, forks or files API",
        )

    async def fork_env(self, env_id: str, trajectories: Sequence[str]) -> list[str]:
        """New environments, one per trajectory, on the parent's node, starting from the
        parent's files (not its processes); returns their ids in order."""
        raise self._no_layers("env_id", env_id)

    async def snapshot(self, env_id: str) -> str:
        """Keep the environment's files as they are now; returns the snapshot's id."""
        raise self._no_layers("env_id", env_id)

    def snapshots(self) -> list[dict[str, Any]]:
        return []

    async def delete_snapshot(self, snapshot_id: str) -> None:
        raise ValidationError("snapshot", snapshot_id, "no such snapshot")

    async def write_files(self, env_id: str, contents: Mapping[str, bytes]) -> None:
        raise self._no_layers("env_id", env_id)

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        raise self._no_layers("env_id", env_id)

    def tar_files(self, env_id: str, path: str) -> AsyncIterator[bytes]:
        """A tar stream of one folder of the environment."""
        raise self._no_layers("env_id", env_id)
