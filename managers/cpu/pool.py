"""Environment pool logic (paper 5.2), pure and shared by simulation and production.

One environment per trajectory holds the trajectory's memory reservation for its whole life; the
node is chosen when the environment opens (the trajectory's first action): among the nodes with
enough memory for the trajectory, those with enough free cores for its first action now, and among
them the least memory-loaded. Every later action of the trajectory stays on that node.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

from tangram.errors import Infeasible, ValidationError
from tangram.pools import Pool


@dataclass(frozen=True, slots=True)
class Environment:
    """A trajectory's sandbox: its node, memory reservation and working directory; `network`:
    whether its commands may reach the network (isolating backends cut it off otherwise).

    `root`: the host folder of the environment's own root filesystem (an image under its
    private layer, see `layers`), None for the host's system files; `disk_mb`: its disk
    reservation (0: none, no bound); `uid`: the uid its commands must run as (a fork runs as
    its parent, whose files it starts from), None: the backend picks one; `image`: an image
    of the backend's own engine (docker), None: the backend's default."""

    id: str
    trajectory: str
    node: str
    memory_mb: int
    workdir: str
    network: bool = False
    root: str | None = None
    disk_mb: int = 0
    uid: int | None = None
    image: str | None = None


def pick_node(
    nodes: Collection[str],
    memory_free: Callable[[str], int],
    memory_load: Callable[[str], float],
    cores_free: Callable[[str], int],
    memory_mb: int,
    min_cores: int = 1,
) -> str | None:
    """The one rule that places a trajectory's environment (this module's docstring), for a
    machine's manager, for Ray's nodes and for the simulator alike: among `nodes` with
    `memory_mb` free, those with `min_cores` free now (all of them if none has), the least
    memory-loaded, then the most free cores, then the name. None when no node has the memory."""
    roomy = [n for n in nodes if memory_free(n) >= memory_mb]
    if not roomy:
        return None
    ready = [n for n in roomy if cores_free(n) >= min_cores] or roomy
    return min(ready, key=lambda n: (memory_load(n), -cores_free(n), n))


class TrajectoryNodes(Mapping[str, str]):
    """trajectory -> node of an `EnvironmentTable`'s environments, live (read-only)."""

    __slots__ = ("_table",)

    def __init__(self, table: EnvironmentTable) -> None:
        self._table = table

    def __getitem__(self, trajectory: str) -> str:
        t = self._table
        return t._envs[t._by_trajectory[trajectory]].node

    def __iter__(self) -> Iterator[str]:
        return iter(self._table._by_trajectory)

    def __len__(self) -> int:
        return len(self._table._by_trajectory)


class EnvironmentTable:
    """Environments, their memory reservations per node and the trajectory -> node bindings:
    the one record of where each trajectory runs (`nodes`, which the scheduler reads through
    `tangram.bindings.Bindings.attach`)."""

    def __init__(
        self, memory_mb: Mapping[str, int], disk_mb: Mapping[str, int] | None = None
    ) -> None:
        for n, m in memory_mb.items():
            if isinstance(m, bool) or not isinstance(m, int) or m <= 0:
                raise ValidationError(f"memory_mb[{n}]", m, "must be a positive integer (MiB)")
        self._capacity = dict(memory_mb)
        self._reserved = {n: 0 for n in memory_mb}
        # disk per node (MiB): environments' layers and frozen layers (forks, snapshots)
        self.disk_capacity = {n: (disk_mb or {}).get(n, 1 << 40) for n in memory_mb}
        self.disk_reserved = {n: 0 for n in memory_mb}
        self._envs: dict[str, Environment] = {}
        self._by_trajectory: dict[str, str] = {}
        self.nodes: Mapping[str, str] = TrajectoryNodes(self)

    # -- membership (Ray's nodes join and leave; a machine's manager has fixed ones) -----------
    def add_node(self, node: str, memory_mb: int, disk_mb: int | None = None) -> None:
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
            raise ValidationError(
                f"memory_mb[{node}]", memory_mb, "must be a positive integer (MiB)"
            )
        self._capacity[node] = memory_mb
        self._reserved.setdefault(node, 0)
        self.disk_capacity[node] = 1 << 40 if disk_mb is None else disk_mb
        self.disk_reserved.setdefault(node, 0)

    def remove_node(self, node: str) -> None:
        """Forget a node none of whose environments is left."""
        if self.on_node(node):
            raise ValidationError("node", node, "still holds environments")
        for table in (self._capacity, self._reserved, self.disk_capacity, self.disk_reserved):
            table.pop(node, None)

    def on_node(self, node: str) -> list[Environment]:
        return [e for e in self._envs.values() if e.node == node]

    def memory_free(self, node: str) -> int:
        return self._capacity[node] - self._reserved[node]

    def memory_load(self, node: str) -> float:
        return self._reserved[node] / self._capacity[node]

    def disk_free(self, node: str) -> int:
        return self.disk_capacity[node] - self.disk_reserved[node]

    def reserve_disk(self, node: str, mb: int) -> None:
        """Count `mb` MiB of disk on `node` (negative: give it back)."""
        self.disk_reserved[node] += mb

    def choose_node(
        self,
        cores: Pool,
        memory_mb: int,
        min_cores: int = 1,
        disk_mb: int = 0,
        exclude: Collection[str] = (),
    ) -> str:
        """The node for a new environment, never one of `exclude` (lost nodes); raises
        `Infeasible` when no node has the memory (and the disk)."""
        if isinstance(memory_mb, bool) or not isinstance(memory_mb, int) or memory_mb <= 0:
            raise ValidationError("env.memory_mb", memory_mb, "must be a positive integer (MiB)")
        if disk_mb and not [n for n in self._capacity if self.disk_free(n) >= disk_mb]:
            best = max(self._capacity, key=self.disk_free)
            raise Infeasible(
                f"env.disk_mb: {disk_mb} MiB fits on no node (most free: "
                f"{self.disk_free(best)} MiB on {best})"
            )
        nodes = [n for n in self._capacity if self.disk_free(n) >= disk_mb and n not in exclude]
        node = pick_node(
            nodes, self.memory_free, self.memory_load, cores.free, memory_mb, min_cores
        )
        if node is None:
            best = max(nodes, key=self.memory_free, default=None)
            if best is None:  # every node is excluded (lost) or full on disk
                raise Infeasible(
                    f"env.memory_mb: {memory_mb} MiB fits on no node (none of "
                    f"the {len(self._capacity)} takes new environments)"
                )
            raise Infeasible(
                f"env.memory_mb: {memory_mb} MiB fits on no node (most free: "
                f"{self.memory_free(best)} MiB on {best})"
            )
        return node

    def add(self, env: Environment) -> None:
        if env.trajectory in self._by_trajectory:
            raise ValidationError(
                "env.trajectory",
                env.trajectory,
                f"already has environment {self._by_trajectory[env.trajectory]}",
            )
        if self.memory_free(env.node) < env.memory_mb:
            raise Infeasible(
                f"env.memory_mb: {env.memory_mb} MiB over the "
                f"{self.memory_free(env.node)} MiB free on {env.node}"
            )
        self._envs[env.id] = env
        self._by_trajectory[env.trajectory] = env.id
        self._reserved[env.node] += env.memory_mb
        self.disk_reserved[env.node] += env.disk_mb

    def remove(self, env_id: str) -> Environment:
        env = self._envs.pop(env_id)
        del self._by_trajectory[env.trajectory]
        self._reserved[env.node] -= env.memory_mb
        self.disk_reserved[env.node] -= env.disk_mb
        return env

    def get(self, env_id: str) -> Environment | None:
        return self._envs.get(env_id)

    def of_trajectory(self, trajectory: str) -> Environment | None:
        env_id = self._by_trajectory.get(trajectory)
        return self._envs[env_id] if env_id is not None else None

    def binding(self, trajectory: str) -> str | None:
        env = self.of_trajectory(trajectory)
        return env.node if env is not None else None

    def all(self) -> list[Environment]:
        return list(self._envs.values())
