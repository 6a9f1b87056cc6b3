"""The `affinity` backend: sched_setaffinity only, for machines without root.

The environment is a working directory; each exec's process starts pinned to the granted
cores (its descendants inherit the mask). There is no CPU quota and no memory
limit, and a process may widen its own mask again: confinement is cooperative, and there is no
isolation at all (the command runs as the server's user, on the host). The process group is
killed at the deadline and after the command exits. Commands see only `grant.command_env`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager

from managers.cpu.backends.base import Backend
from managers.cpu.backends.process import run_local
from managers.cpu.grant import PLUGIN_SOURCE, command_env
from managers.cpu.pool import Environment
from managers.cpu.request import Command, argv_of
from tangram.results import Result


@contextmanager
def _pinned(mask: set[int]) -> Iterator[None]:
    """Pin the spawning thread (only it: sched_setaffinity(0) is per thread on Linux) while it
    spawns, so the child starts with the mask and no Python runs between fork and exec."""
    old = os.sched_getaffinity(0)
    os.sched_setaffinity(0, mask)
    try:
        yield
    finally:
        os.sched_setaffinity(0, old)


class AffinityBackend(Backend):
    name = "affinity"

    @classmethod
    def probe(cls) -> str | None:
        if not hasattr(os, "sched_setaffinity"):
            return "sched_setaffinity is not available on this platform: use backend='sim'"
        return None

    async def open(self, env: Environment, cores: tuple[int, ...]) -> None:
        os.makedirs(env.workdir, exist_ok=True)

    async def exec(self, env: Environment, cores: tuple[int, ...], command: Command,
                   timeout: float, output_cap: int, elastic: bool = False) -> Result:
        variables = command_env(env.id, len(cores), env.workdir, elastic=elastic,
                                plugin_dir=str(PLUGIN_SOURCE.parent))
        return await run_local(argv_of(command), cwd=env.workdir, env=variables, timeout=timeout,
                               output_cap=output_cap, spawning=lambda: _pinned(set(cores)))

    async def close(self, env: Environment) -> None:
        shutil.rmtree(env.workdir, ignore_errors=True)
