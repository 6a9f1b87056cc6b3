"""The environments part of the runtime's facade (`tangram.runtime.facade.Tangram`): opening,
forking, snapshotting, the files, closing, and the idle reaper that reclaims environments."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from managers.base import EnvironmentManager
from managers.cpu.environments import EnvRecord, EnvState
from tangram.errors import NotFound, TangramError, ValidationError
from tangram.results import Status
from tangram.runtime.entries import UNKNOWN_ENV
from tangram.scheduling import SchedulerInterface
from tangram.validation import boolean, pos_int

log = logging.getLogger("tangram")


class Environments:
    """`Tangram`'s environment methods; `Tangram` sets the state they read and provides the
    loop's `_admitting`, `_kick` and `_finish_cancelled`."""

    cpu: EnvironmentManager | None
    scheduler: SchedulerInterface
    idle_env_s: float | None
    _clock: Callable[[], float]
    _closed: bool

    if TYPE_CHECKING:  # the loop's, `Tangram`'s own

        def _admitting(self) -> None: ...

        def _kick(self) -> None: ...

        def _finish_cancelled(
            self, action_id: str, why: str, status: Status = Status.CANCELLED
        ) -> None: ...

    async def open_env(
        self,
        trajectory: str,
        memory_mb: int = 1024,
        network: bool = False,
        *,
        image: str | None = None,
        disk_mb: int | None = None,
        snapshot: str | None = None,
    ) -> str:
        """The trajectory's sandbox: `memory_mb` reserved for its life, no network unless
        `network` (backends that isolate: bwrap, docker). `image`: its root filesystem is that
        image of the node's store under a private layer bounded by `disk_mb` MiB; `snapshot`:
        it starts from a snapshot's files; `disk_mb` alone: a bounded, forkable work folder
        over the host's system files (see `managers.cpu.roots`)."""
        self._admitting()
        if self.cpu is None:
            raise ValidationError("env", trajectory, "no CPU pool is configured")
        pos_int("memory_mb", memory_mb, " (MiB)")
        boolean("network", network)
        layers = {
            k: v
            for k, v in (("image", image), ("disk_mb", disk_mb), ("snapshot", snapshot))
            if v is not None
        }
        env_id = await self.cpu.open_env(trajectory, memory_mb, network=network, **layers)
        self._opened(env_id, trajectory)
        log.info(
            "env %s: trajectory %s on node %s (%d MiB reserved%s)",
            env_id,
            trajectory,
            self.cpu.binding(trajectory),
            memory_mb,
            "".join(f", {k} {v}" for k, v in layers.items()),
        )
        return env_id

    def _opened(self, env_id: str, trajectory: str) -> None:
        assert self.cpu is not None
        self.scheduler.bind(trajectory, self.cpu.resource, self.cpu.binding(trajectory))
        self._env(env_id).last_used = self._clock()
        if not self._closed and self.scheduler.queue:
            self._kick()  # an environment opening is an event, as in the simulator's engine

    async def fork_env(self, env_id: str, trajectories: list[str]) -> list[str]:
        """One new environment per trajectory, on the parent's node, whose files start as the
        parent's are now (files only: processes are not forked, and the parent's own running
        ones are stopped). Time independent of how much the parent wrote."""
        self._admitting()
        e = self._env(env_id)
        if e.actions:
            raise ValidationError(
                "env_id", env_id, "a command of it is queued or running: fork it when it is idle"
            )
        assert self.cpu is not None
        children = await self.cpu.fork_env(env_id, trajectories)
        for child, trajectory in zip(children, trajectories):
            self._opened(child, trajectory)
        e.last_used = self._clock()
        log.info("env %s forked into %s", env_id, ", ".join(children))
        return children

    async def snapshot(self, env_id: str) -> str:
        """Keep the environment's files as they are now under an id (`open_env(snapshot=)`);
        the environment goes on. Snapshots outlive the environment, not the server."""
        self._admitting()
        e = self._env(env_id)
        if e.actions:
            raise ValidationError(
                "env_id",
                env_id,
                "a command of it is queued or running: snapshot it when it is idle",
            )
        assert self.cpu is not None
        return await self.cpu.snapshot(env_id)

    def snapshots(self) -> list[dict[str, Any]]:
        return [] if self.cpu is None else self.cpu.snapshots()

    async def delete_snapshot(self, snapshot_id: str) -> None:
        if self.cpu is None:
            raise NotFound("snapshot", snapshot_id, "no CPU pool is configured")
        await self.cpu.delete_snapshot(snapshot_id)

    async def write_files(self, env_id: str, files: Mapping[str, bytes]) -> None:
        """Put files into the environment: an absolute path is its own root (with an image),
        a relative one is under its work folder; `..` and links never leave it."""
        self._admitting()
        self._env(env_id).last_used = self._clock()
        assert self.cpu is not None
        await self.cpu.write_files(env_id, files)

    def tar_files(self, env_id: str, path: str = "/sandbox") -> AsyncIterator[bytes]:
        """A tar stream of one folder of the environment (links kept, never followed)."""
        self._admitting()
        self._env(env_id).last_used = self._clock()
        assert self.cpu is not None
        return self.cpu.tar_files(env_id, path)

    async def read_files(self, env_id: str, paths: list[str]) -> dict[str, bytes | None]:
        """Each path's content (None where missing or not a regular file)."""
        self._admitting()
        self._env(env_id).last_used = self._clock()
        assert self.cpu is not None
        return await self.cpu.read_files(env_id, paths)

    async def close_env(self, env_id: str) -> None:
        env = self._env(env_id)
        cancelled = False
        for aid in list(env.actions):  # queued actions of the env are cancelled
            if self.scheduler.cancel(aid):
                cancelled = True
                self._finish_cancelled(aid, "its environment was closed")
        if cancelled and not self._closed:
            self._kick()  # what waited behind them may start now
        assert self.cpu is not None
        await self.cpu.close_env(env_id)
        self.scheduler.unbind(env.env.trajectory)
        log.info("env %s closed", env_id)

    async def reset_env(self, env_id: str) -> str | None:
        """Bring an idle environment back to the state of a never-used one, for an unrelated
        next user (the `/run_code` warm pool): its processes, files and IPC objects gone
        (`managers.cpu.backends.bwrap.reset`). None when done, else why not: the caller
        closes it then."""
        env = self._env(env_id)
        if env.actions:
            return "it has actions queued or running"
        why = await self.cpu.reset_env(env_id)
        if why is None:
            env.last_used = self._clock()
        return why

    def _env(self, env_id: str) -> EnvRecord:
        """The open environment's record (the CPU manager's: `managers.cpu.environments`)."""
        record = None if self.cpu is None else self.cpu.envs.record(env_id)
        if record is None or record.state in (EnvState.CLOSING, EnvState.CLOSED):
            raise NotFound("env_id", env_id, UNKNOWN_ENV)
        return record

    # -- idle reclaim ---------------------------------------------------------------------------
    async def _reap_idle(self) -> None:
        assert self.idle_env_s
        period = max(0.05, min(5.0, self.idle_env_s / 4))
        while True:
            await asyncio.sleep(period)
            cutoff = self._clock() - self.idle_env_s
            for env in [] if self.cpu is None else self.cpu.envs.records():
                if env.state is EnvState.IDLE and not env.actions and env.last_used < cutoff:
                    log.info("env %s idle for %.0f s: reclaimed", env.id, self.idle_env_s)
                    try:
                        await self.close_env(env.id)
                    except TangramError:
                        pass
