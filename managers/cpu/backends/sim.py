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

from managers.cpu.backends.base import Backend, LimitCounts, Sandbox
from managers.cpu.environments import Environment
from managers.cpu.request import Command, ExecSpec, describe
from tangram.results import Result, Status


class SimCpuBackend(Backend):
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
        self.execs: list[tuple[str, tuple[int, ...], str]] = []  # (env, cores, command) log
        self.gpu_grants: list[tuple[str, tuple[int, ...], str]] = []  # (env, GPUs, command)

    @classmethod
    def probe(cls) -> str | None:
        return None

    async def _open(self, env: Environment, cores: tuple[int, ...]) -> SimSandbox:
        return SimSandbox(self, env, cores)


class SimSandbox(Sandbox):
    """A record: the cores it was opened with and the commands killed for memory."""

    backend: SimCpuBackend

    def __init__(self, backend: SimCpuBackend, env: Environment, cores: tuple[int, ...]) -> None:
        super().__init__(backend, env)
        self.cores = cores
        self.ooms = 0  # commands killed for memory

    async def _run(self, spec: ExecSpec) -> Result:
        b, env = self.backend, self.env
        b.execs.append((env.id, spec.cores, describe(spec.command)))
        if spec.gpus:
            b.gpu_grants.append((env.id, spec.gpus, describe(spec.command)))
        d = b.duration(spec.command, len(spec.cores))
        if b.peak_mb(spec.command) > env.memory_mb:  # killed as it reaches the limit
            self.ooms += 1
            return Result(Status.ERROR, -9, detail="killed by signal SIGKILL (simulated)")
        if d > spec.timeout:
            await b.sleep(spec.timeout * b.time_scale)
            return Result(
                Status.TIMEOUT, detail=f"killed at its {spec.timeout:g} s timeout (simulated)"
            )
        await b.sleep(d * b.time_scale)
        return Result(Status.OK, 0, detail=f"simulated {d:g} s on {len(spec.cores)} cores")

    def _limit_counts(self) -> LimitCounts:
        return LimitCounts(ooms=self.ooms)

    async def _close(self) -> None:
        pass
