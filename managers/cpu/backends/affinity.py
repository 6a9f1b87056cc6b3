"""The `affinity` backend: sched_setaffinity only, for machines without root.

The environment is a working directory; each exec's process starts pinned to the granted
cores (its descendants inherit the mask). There is no CPU quota and no memory
limit, and a process may widen its own mask again: confinement is cooperative, and there is no
isolation at all (the command runs as the server's user, on the host). The process group is
killed at the deadline, after the command exits and when its environment closes. Commands see
only `grant.command_env`. GPUs granted to an exec are named in its variables only
(`CUDA_VISIBLE_DEVICES`, `TANGRAM_GPUS`): every GPU of the machine stays reachable.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from managers.cpu.backends.base import Backend, Sandbox
from managers.cpu.backends.process import kill_group, run_local
from managers.cpu.environments import Environment
from managers.cpu.request import ExecSpec
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
    guarantees_lost = (
        "no sandbox (commands run as the server's user on the host), cores by affinity only "
        "(no memory or pids limit across processes, no accounting of a process that leaves "
        "the affinity)"
    )

    @classmethod
    def probe(cls) -> str | None:
        if not hasattr(os, "sched_setaffinity"):
            return "sched_setaffinity is not available on this platform: use backend='sim'"
        return None

    async def _open(self, env: Environment, cores: tuple[int, ...]) -> AffinitySandbox:
        self._make_workdir(env)
        return AffinitySandbox(self, env)


class AffinitySandbox(Sandbox):
    """A work folder and the process groups of its running commands."""

    def __init__(self, backend: Backend, env: Environment) -> None:
        super().__init__(backend, env)
        self.groups: set[int] = set()  # process groups of its running execs

    async def _run(self, spec: ExecSpec) -> Result:
        return await run_local(
            spec.argv,
            cwd=self.env.workdir,
            env=self.environ(spec),
            timeout=spec.timeout,
            output_cap=spec.output_cap,
            spawning=lambda: _pinned(set(spec.cores)),
            groups=self.groups,
        )

    async def _close(self) -> None:
        for group in list(self.groups):
            kill_group(group)
        self.groups.clear()
        await self.backend._remove_workdir(self.env)
