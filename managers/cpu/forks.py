"""Forks and snapshots of the CPU manager's environments (see `roots`): O(1) in the data an
environment wrote, by freezing its writable layer as a shared lower.

A mixin of `CpuManager` (its one job: the freeze and what is built on it); it needs the
manager's table (each environment's record: its state and tree), state folder, backend and its
`_open`/`close_env`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING

from managers.cpu.backends.base import Backend
from managers.cpu.environments import Environment, EnvironmentTable, EnvRecord, EnvState
from managers.cpu.roots import Roots
from tangram.errors import ValidationError

MAX_FORK = 256  # children of one fork


class EnvForks:
    envs: EnvironmentTable
    roots: Roots | None
    backend: Backend

    if TYPE_CHECKING:  # the manager's own

        async def _open(self, proto: Environment, stack=None) -> str: ...

        async def end_sessions(self, record: EnvRecord) -> None: ...

        async def close_env(self, env_id: str) -> None: ...

        def _check_room(self, node: str, n: int, memory_mb: int, disk_mb: int) -> None: ...

        def _require_started(self) -> None: ...

    def _layered(self, env_id: str, what: str) -> tuple[EnvRecord, Roots]:
        self._require_started()
        record = self.envs.record(env_id)
        if record is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        if self.roots is None:
            raise ValidationError(
                "env_id", env_id, f"the {self.backend.name} backend has no layers to {what}"
            )
        Roots.rooted(env_id, record.rooted, what)
        if record.state is EnvState.FREEZING:
            raise ValidationError("env_id", env_id, "a fork or snapshot of it is under way")
        if record.state is not EnvState.IDLE:
            raise ValidationError(
                "env_id",
                env_id,
                f"it is {record.state.value}: {what} when it is idle (files are frozen, "
                f"processes are not forked)",
            )
        return record, self.roots

    async def _freeze(self, record: EnvRecord, roots: Roots, keep: bool = False) -> str | None:
        """Stop the sandbox, freeze its layer, remount on a fresh one, restart it; `keep`:
        also keep the frozen stack as a snapshot (returns its id). A command granted meanwhile
        waits until the sandbox is back (FREEZING), and so does `close`."""
        env = record.env
        record.to(EnvState.FREEZING)
        try:
            await self.end_sessions(record)  # files carry over, sessions do not
            await record.sandbox.suspend()
            try:
                frozen = await asyncio.to_thread(roots.freeze, record.rooted, env.disk_mb)
                frozen.counted_mb = roots.layers.allocated_mb(frozen)
                self.envs.reserve_disk(env.node, frozen.counted_mb)
            finally:
                await record.sandbox.resume()
            if keep:
                return roots.keep(record.rooted, env.id, env.node).id
            return None
        finally:
            record.to(EnvState.IDLE)

    async def fork_env(self, env_id: str, trajectories: Sequence[str]) -> list[str]:
        """New environments, one per trajectory, on the parent's node, whose files start as the
        parent's are now (its processes are not forked: the parent's own are stopped, as a
        fork restarts its sandbox). O(1) in the data the parent wrote: the parent's layer is
        frozen as a shared lower of the parent and every child, each of which gets a fresh
        writable layer of the parent's `disk_mb` and memory of the parent's `memory_mb`.
        Each child runs as a uid of its own, its inherited files its own (idmapped layers, see
        `idmap`); where the kernel has no idmapped layers, as the parent's uid."""
        if (
            isinstance(trajectories, str)
            or not isinstance(trajectories, Sequence)
            or not 1 <= len(trajectories) <= MAX_FORK
        ):
            raise ValidationError(
                "trajectories", trajectories, f"must be a list of 1 to {MAX_FORK} trajectory names"
            )
        for t in trajectories:
            if not isinstance(t, str) or not t or self.envs.of_trajectory(t) is not None:
                raise ValidationError(
                    "trajectories", t, "must be a new trajectory name (one without an environment)"
                )
        if len(set(trajectories)) != len(trajectories):
            raise ValidationError("trajectories", list(trajectories), "names repeat")
        record, roots = self._layered(env_id, "fork")
        parent = record.env
        self._check_room(parent.node, len(trajectories), parent.memory_mb, parent.disk_mb)
        await self._freeze(record, roots)
        stack = record.rooted.stack
        uid = roots.inherited_uid(record.rooted.uid)
        proto = [
            Environment(
                "",
                t,
                parent.node,
                parent.memory_mb,
                "",
                parent.network,
                disk_mb=parent.disk_mb,
                uid=uid,
            )
            for t in trajectories
        ]
        opened = await asyncio.gather(
            *(self._open(p, stack) for p in proto), return_exceptions=True
        )
        failed = [r for r in opened if isinstance(r, BaseException)]
        if failed:
            for r in opened:
                if isinstance(r, str):
                    await self.close_env(r)
            raise failed[0]
        return [str(r) for r in opened]

    async def snapshot(self, env_id: str) -> str:
        """Keep the environment's files as they are now under a snapshot id (the environment
        goes on, from a fresh layer over them); O(1) in data like `fork_env`."""
        record, roots = self._layered(env_id, "snapshot")
        sid = await self._freeze(record, roots, keep=True)
        assert sid is not None
        return sid

    def snapshots(self) -> list[dict]:
        roots = self.roots
        if roots is None:
            return []
        return [s.to_dict(roots.snapshot_mb(s)) for s in roots.snapshots.values()]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        if self.roots is None:
            raise ValidationError("snapshot", snapshot_id, "no such snapshot")
        node = self.roots.snapshot(snapshot_id).node
        for layer in await asyncio.to_thread(self.roots.delete, snapshot_id):
            self.envs.reserve_disk(node, -layer.counted_mb)
