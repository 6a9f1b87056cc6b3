"""The `sim` backend: nothing runs; an exec takes a modelled time on an injected clock.

`duration(command, cores)` models the run time (default 0); `sleep` waits it out (default
`asyncio.sleep` scaled by `time_scale`, 0 by default so tests and the simulator do not wait).
Environments are records only, so any number of nodes can be simulated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from managers.cpu.backends.base import Backend, EnvironmentBroken
from managers.cpu.pool import Environment
from managers.cpu.request import Command, describe
from tangram.results import Result


class SimBackend(Backend):
    name = "sim"
    local = False

    def __init__(self, duration: Callable[[Command, int], float] | None = None,
                 time_scale: float = 0.0,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.duration = duration or (lambda command, cores: 0.0)
        self.time_scale = time_scale
        self.sleep = sleep
        self.envs: dict[str, tuple[int, ...]] = {}
        self.execs: list[tuple[str, tuple[int, ...], str]] = []  # (env, cores, command) log

    @classmethod
    def probe(cls) -> str | None:
        return None

    async def open(self, env: Environment, cores: tuple[int, ...]) -> None:
        self.envs[env.id] = cores

    async def exec(self, env: Environment, cores: tuple[int, ...], command: Command,
                   timeout: float, output_cap: int, elastic: bool = False) -> Result:
        if env.id not in self.envs:
            raise EnvironmentBroken(f"environment {env.id} is broken: not open in the simulator")
        self.execs.append((env.id, cores, describe(command)))
        d = self.duration(command, len(cores))
        if d > timeout:
            await self.sleep(timeout * self.time_scale)
            return Result("timeout", detail=f"killed at its {timeout:g} s timeout (simulated)")
        await self.sleep(d * self.time_scale)
        return Result("ok", 0, detail=f"simulated {d:g} s on {len(cores)} cores")

    async def close(self, env: Environment) -> None:
        self.envs.pop(env.id, None)
