"""Environments (paper 5.2): each one's record and state, and the table that places them; pure
and shared by the CPU manager, Ray's and the simulator.

One environment per trajectory holds the trajectory's memory reservation for its whole life; the
node is chosen when the environment opens (the trajectory's first action): among the nodes with
enough memory for the trajectory, those with enough free cores for its first action now, and among
them the least memory-loaded. Every later action of the trajectory stays on that node.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tangram.errors import Infeasible, TangramError, ValidationError
from tangram.pools import Pool


@dataclass(frozen=True, slots=True)
class Environment:
    """A trajectory's sandbox: its node, memory reservation and working directory; `network`:
    whether its commands may reach the network (isolating backends cut it off otherwise).

    `root`: the host folder of the environment's own root filesystem (an image under its
    private layer, see `layers`), None for the host's system files; `disk_mb`: its disk
    reservation (0: none, no bound); `uid`: the uid its commands must run as (given by the
    manager where its layers are mapped to it, see `idmap`), None: the backend picks one;
    `image`: an image of the backend's own engine (docker; the rootless bwrap backend's: of
    the node's image store), None: the backend's default; `lower`: (rootless bwrap) that
    image's tree, the read-only lower layer of the overlay its sandbox mounts as its root."""

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
    lower: str | None = None


class EnvState(enum.Enum):
    """Where an environment is in its life; `NEXT` says what may follow each state."""

    OPENING = "opening"  # in the table (its memory counted), its sandbox starting
    IDLE = "idle"  # open, no command running
    RUNNING = "running"  # one command or more running (`EnvRecord.running`)
    FREEZING = "freezing"  # a fork or snapshot re-stacks its files: commands wait
    RESETTING = "resetting"  # brought back to a never-used state (the warm pool)
    BROKEN = "broken"  # its sandbox is lost: commands fail saying why; only closing is left
    CLOSING = "closing"  # being closed (a second close is a no-op)
    CLOSED = "closed"  # gone from the table


NEXT: dict[EnvState, frozenset[EnvState]] = {
    EnvState.OPENING: frozenset({EnvState.IDLE, EnvState.CLOSING}),
    EnvState.IDLE: frozenset(
        {
            EnvState.RUNNING,
            EnvState.FREEZING,
            EnvState.RESETTING,
            EnvState.BROKEN,
            EnvState.CLOSING,
        }
    ),
    EnvState.RUNNING: frozenset({EnvState.IDLE, EnvState.BROKEN, EnvState.CLOSING}),
    EnvState.FREEZING: frozenset({EnvState.IDLE, EnvState.BROKEN}),
    EnvState.RESETTING: frozenset({EnvState.IDLE, EnvState.BROKEN}),
    EnvState.BROKEN: frozenset({EnvState.CLOSING}),
    EnvState.CLOSING: frozenset({EnvState.CLOSED}),
    EnvState.CLOSED: frozenset(),
}
# commands and closes wait while an environment is in one of these
SETTLING = frozenset({EnvState.OPENING, EnvState.FREEZING, EnvState.RESETTING})
TRAJECTORY, WARM_POOL = "trajectory", "warm-pool"  # who an environment serves (`owner`)


class IllegalTransition(TangramError):
    """An environment asked to go where its state does not lead (a bug, not a user error)."""


@dataclass(eq=False, slots=True)
class EnvRecord:
    """The one record of an open environment: what it is (`env`), its state (`to` is the one
    way to change it), the commands running in it, the actions its caller has queued or
    running (`actions`, the facade's), when it was last used (the idle reaper's clock), whom
    it serves (`owner`: its trajectory, or the `/run_code` warm pool, which counts the
    requests it served, `uses`, and whether one holds it now, `lent`), why it broke, its tree
    (`rooted`, `pin`: see `roots`), its backend's sandbox (`sandbox`) and its shell sessions
    (`sessions`, by name)."""

    env: Environment
    state: EnvState = EnvState.OPENING
    running: int = 0
    actions: set[str] = field(default_factory=set)
    last_used: float = 0.0
    owner: str = TRAJECTORY
    uses: int | None = None  # the warm pool's: requests served (None: not to be reused)
    lent: bool = False  # the warm pool's: a request holds it now
    why: str = ""
    rooted: Any = None  # a `layers.Rooted` where it has layers
    pin: int | None = None  # its image's pin in the store
    sandbox: Any = None  # its backend's `Sandbox` (None while it opens)
    sessions: dict[str, Any] = field(default_factory=dict)  # name -> its `ShellSession`
    background: Any = None  # the node's background cores its sessions share (`shells`)
    _settled: asyncio.Event | None = None

    @property
    def id(self) -> str:
        return self.env.id

    def to(self, state: EnvState, why: str = "") -> None:
        """Go to `state`, if `NEXT` allows it (`IllegalTransition` otherwise); leaving a
        SETTLING state wakes what waits for it (`settled`); `why`: why it broke."""
        if state not in NEXT[self.state]:
            raise IllegalTransition(
                f"environment {self.env.id}: {self.state.value} cannot become {state.value}"
            )
        if self.state in SETTLING and self._settled is not None:
            self._settled.set()
            self._settled = None
        if state is EnvState.BROKEN:
            self.why = why or f"environment {self.env.id} is broken"
        self.state = state

    async def settled(self) -> None:
        """Return once no open, fork, snapshot or reset of it is under way."""
        while self.state in SETTLING:
            if self._settled is None:
                self._settled = asyncio.Event()
            await self._settled.wait()

    def command_started(self) -> None:
        """One more command in it (IDLE or RUNNING: RUNNING)."""
        if self.state is not EnvState.RUNNING:
            self.to(EnvState.RUNNING)
        self.running += 1

    def command_ended(self) -> None:
        """One command fewer; the last one leaves it IDLE (unless it broke or is closing)."""
        self.running -= 1
        if not self.running and self.state is EnvState.RUNNING:
            self.to(EnvState.IDLE)


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
        return t._envs[t._by_trajectory[trajectory]].env.node

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
        self._envs: dict[str, EnvRecord] = {}  # the one mapping keyed by environment id
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
        return [r.env for r in self._envs.values() if r.env.node == node]

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

    def add(self, env: Environment, state: EnvState = EnvState.IDLE) -> EnvRecord:
        """Count the environment on its node and record it, in `state` (OPENING where its
        sandbox is still to start); returns its record."""
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
        record = self._envs[env.id] = EnvRecord(env, state)
        self._by_trajectory[env.trajectory] = env.id
        self._reserved[env.node] += env.memory_mb
        self.disk_reserved[env.node] += env.disk_mb
        return record

    def remove(self, env_id: str) -> Environment:
        record = self._envs.pop(env_id)
        if record.state is not EnvState.CLOSED:
            record.state = EnvState.CLOSED  # (from any state: an open that failed too)
            if record._settled is not None:  # what waited for it sees it gone
                record._settled.set()
                record._settled = None
        env = record.env
        del self._by_trajectory[env.trajectory]
        self._reserved[env.node] -= env.memory_mb
        self.disk_reserved[env.node] -= env.disk_mb
        return env

    def get(self, env_id: str) -> Environment | None:
        record = self._envs.get(env_id) if isinstance(env_id, str) else None
        return None if record is None else record.env

    def record(self, env_id: str) -> EnvRecord | None:
        return self._envs.get(env_id) if isinstance(env_id, str) else None

    def records(self) -> list[EnvRecord]:
        return list(self._envs.values())

    def of_trajectory(self, trajectory: str) -> Environment | None:
        env_id = self._by_trajectory.get(trajectory)
        return self._envs[env_id].env if env_id is not None else None

    def binding(self, trajectory: str) -> str | None:
        env = self.of_trajectory(trajectory)
        return env.node if env is not None else None

    def all(self) -> list[Environment]:
        return [r.env for r in self._envs.values()]
