"""The `sim` backend: nothing runs; an exec takes a modelled time on an injected clock.

`duration(command, cores)` models the run time (default 0); `sleep` waits it out (default
`asyncio.sleep` scaled by `time_scale`, 0 by default so tests and the simulator do not wait);
`peak_mb(command)` models the memory a command needs (default 0): past the environment's
`memory_mb` the command is killed (SIGKILL) and counted as an OOM kill, so its result is named
by the same rule as a real backend's (`base.name_limits`). Environments are records only, so
any number of nodes can be simulated. An exec granted GPUs records them (`gpu_grants`): nothing
runs, so nothing sees them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from managers.cpu.backends.base import Backend, LimitCounts
from managers.cpu.environments import Environment
from managers.cpu.request import Command, describe
from tangram.results import Result, Status


class SimBackend(Backend):
    name = "sim"
    local = False
    support_files = False
    gpu_mode = "recorded"

    def __init__(
        self,
        duration: Callable[[Command, int], float] | None = None,
        time_scale: float = 0.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        peak_mb: Callable[[Command], int] | None = None,
    ) -> None:
        super().__init__()
        self.duration = duration or (lambda command, cores: 0.0)
        self.time_scale = time_scale
        self.sleep = sleep
        self.peak_mb = peak_mb or (lambda command: 0)
        self.envs: dict[str, tuple[int, ...]] = {}
        self.ooms: dict[str, int] = {}  # env id -> commands killed for memory
        self.execs: list[tuple[str, tuple[int, ...], str]] = []  # (env, cores, command) log
        self.gpu_grants: list[tuple[str, tuple[int, ...], str]] = []  # (env, GPUs, command)

    @classmethod
    def probe(cls) -> str | None:
        return None

    async def _open(self, env: Environment, cores: tuple[int, ...]) -> None:
        self.envs[env.id] = cores
        self.ooms[env.id] = 0

    async def _exec(
        self,
        env: Environment,
        cores: tuple[int, ...],
        command: Command,
        timeout: float,
        output_cap: int,
        elastic: bool,
        gpus: tuple[int, ...] = (),
    ) -> Result:
        self.execs.append((env.id, cores, describe(command)))
        if gpus:
            self.gpu_grants.append((env.id, gpus, describe(command)))
        d = self.duration(command, len(cores))
        if self.peak_mb(command) > env.memory_mb:  # killed as it reaches the limit
            self.ooms[env.id] += 1
            return Result(Status.ERROR, -9, detail="killed by signal SIGKILL (simulated)")
        if d > timeout:
            await self.sleep(timeout * self.time_scale)
            return Result(Status.TIMEOUT, detail=f"killed at its {timeout:g} s timeout (simulated)")
        await self.sleep(d * self.time_scale)
        return Result(Status.OK, 0, detail=f"simulated {d:g} s on {len(cores)} cores")

    def _limit_counts(self, env: Environment) -> LimitCounts:
        return LimitCounts(ooms=self.ooms.get(env.id, 0))

    async def _close(self, env: Environment) -> None:
        self.envs.pop(env.id, None)
        self.ooms.pop(env.id, None)
