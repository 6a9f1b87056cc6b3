"""The executor backend behind the CPU manager: how an environment exists and how one exec runs.

A backend does the side effects only; the manager owns the pool logic. Contract of `exec`: the
command runs confined to exactly `cores` (cpuset and, where the backend can, a CPU quota of
len(cores) cores); when it returns, no process of that exec is left running (leftovers are
killed, so the cores really come back); the action's own failures come back as an `Result`.
A lost environment raises `EnvironmentBroken`.
"""

from __future__ import annotations

import signal
from abc import ABC, abstractmethod
from collections.abc import Callable

from managers.cpu.pool import Environment
from managers.cpu.request import Command
from tangram.errors import ActionFailed
from tangram.results import Result


class EnvironmentBroken(ActionFailed):
    """The environment's sandbox is gone (its container died, its cgroup was removed)."""


class Backend(ABC):
    name: str = "backend"
    local: bool = True  # runs on this machine only (one node)
    roots: bool = False  # gives an environment its own root filesystem (`Environment.root`)
    engine_images: bool = False  # takes `Environment.image` from its own engine (docker)

    @classmethod
    @abstractmethod
    def probe(cls) -> str | None:
        """None when this backend can run here, else why not and how to fix it."""

    @abstractmethod
    async def open(self, env: Environment, cores: tuple[int, ...]) -> None:
        """Create the sandbox of `env` (all of `cores` allowed while idle)."""

    @abstractmethod
    async def exec(self, env: Environment, cores: tuple[int, ...], command: Command,
                   timeout: float, output_cap: int, elastic: bool = False) -> Result:
        """Run one command confined to `cores`, with the environment of `grant.command_env`
        (never the server's own); `elastic`: let pytest use the cores (see `grant`). See the
        module docstring."""

    @abstractmethod
    async def close(self, env: Environment) -> None:
        """Kill everything left in the sandbox and remove it. Idempotent."""

    async def suspend(self, env: Environment) -> None:
        """Kill everything running in the environment (its files are about to be re-stacked:
        a fork or snapshot); `resume` follows. Nothing to do by default."""

    async def resume(self, env: Environment) -> None:
        """Make the environment usable again after `suspend` (same id, same paths)."""

    def owner(self, env: Environment) -> int | None:
        """The host uid the environment's commands run as (its files belong to it), None when
        they run as the server's own user."""
        return None

    async def shutdown(self) -> None:
        """Release what the backend holds beyond environments (clients, parent cgroups)."""

    def sweep(self) -> list[str]:
        """Kill and remove what servers that died left behind (their PIDs are gone): called
        once before serving; returns a line per thing swept, for the log."""
        return []

    def describe(self) -> str:
        return self.name


def outcome_of(exit_code: int | None, stdout: bytes, stderr: bytes, truncated: bool,
               timed_out: bool, timeout: float, output_cap: int) -> Result:
    """Map a finished process to an `Result` whose detail says what happened."""
    out = stdout.decode(errors="replace")
    err = stderr.decode(errors="replace")
    tail = f"; output truncated at {output_cap} bytes per stream" if truncated else ""
    if timed_out:
        return Result("timeout", exit_code, out, err,
                       detail=f"killed at its {timeout:g} s timeout with its whole process "
                              f"tree{tail}", truncated=truncated)
    if exit_code == 0:
        return Result("ok", 0, out, err, detail=f"exit code 0{tail}", truncated=truncated)
    if exit_code is not None and exit_code < 0:
        try:
            sig = signal.Signals(-exit_code).name
        except ValueError:
            sig = str(-exit_code)
        what = f"killed by signal {sig}"
    elif exit_code == 127:
        first = err.strip().splitlines()[-1] if err.strip() else ""
        what = "exit code 127: command not found" + (f" ({first})" if first else "")
    elif exit_code == 126:
        what = "exit code 126: command not executable"
    else:
        what = f"exit code {exit_code}"
    return Result("error", exit_code, out, err, detail=what + tail, truncated=truncated)


def not_found(command: str, exc: OSError) -> Result:
    return Result("error", 127, "", str(exc), detail=f"exit code 127: command not found "
                   f"({command!r}: {exc.strerror or exc})")


KillFn = Callable[[], None]
