"""The shell-session part of the runtime's facade (`tangram.runtime.facade.Tangram`): a bash
kept open in an environment for a whole trajectory, each command one action
(`managers.cpu.shells` holds the mechanism and the grant per command; docs/sessions.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from managers.base import EnvironmentManager
from managers.cpu.actions import exec_action
from tangram.errors import ValidationError
from tangram.results import Result
from tangram.scheduling import SchedulerInterface

if TYPE_CHECKING:
    from managers.base import Manager
    from managers.cpu.environments import EnvRecord
    from tangram.actions import Action

log = logging.getLogger("tangram")
MAX_TYPED_LINE = 4000  # characters of one line of interactive text (a terminal's line: 4,095)


class Sessions:
    """`Tangram`'s session methods; `Tangram` sets the state they read."""

    cpu: EnvironmentManager | None
    scheduler: SchedulerInterface
    _clock: Callable[[], float]

    if TYPE_CHECKING:  # `Tangram`'s own

        def _admitting(self) -> None: ...

        def _kick(self) -> None: ...

        def _env(self, env_id: str) -> EnvRecord: ...

        def _now(self) -> float: ...

        async def _submit_in(
            self, record: EnvRecord, action: Action, manager: Manager, metric_kind: str
        ) -> Result: ...

    def _shells(self, env_id: str, name: object) -> Any:
        """The CPU manager, where it has sessions; ValidationError naming why not."""
        if self.cpu is None or not hasattr(self.cpu, "open_session"):
            what = "no CPU pool is configured" if self.cpu is None else "this runtime's CPU "
            raise ValidationError(
                "session", name, f"{what}manager has no shell sessions (a local one has)"
            )
        return self.cpu

    async def open_session(self, env: str, name: str = "default") -> str:
        """Start a shell session `name` in environment `env`: a bash in its sandbox whose state
        (working folder, variables, functions, background jobs) lasts from one `run` to the
        next. Between commands its processes run on the background allowance
        (`cpu: {background: ...}`, 0.1 of a core per environment by default)."""
        self._admitting()
        record = self._env(env)
        await self._shells(env, name).open_session(env, name)
        record.last_used = self._clock()
        log.info("env %s: session %s opened", env, name)
        return name

    async def run(
        self,
        env: str,
        name: str,
        command: str,
        cpu: Any = 1,
        elastic: bool = False,
        timeout: float = 60.0,
        output_cap: int | None = None,
        *,
        interactive: bool = False,
        expect: list[str] | tuple[str, ...] = (),
        kind: str | None = None,
    ) -> Result:
        """Run one command in session `name` as one action: its `cpu` cores are the session's
        for the command alone. A timeout interrupts it (SIGINT, then SIGKILL to its process
        group) and the session lives on; a session whose shell is gone answers `failed`
        naming how it went. `interactive`: `command` is typed into the program that holds
        the terminal (`python3`, `pdb`), ended by one of the `expect` prompts or by the
        shell's own prompt (the program exited)."""
        self._admitting()
        record = self._env(env)
        shells = self._shells(env, name)
        if not isinstance(name, str) or name not in shells.sessions_of(env):
            raise ValidationError("session", name, f"no open session in environment {env}")
        if not isinstance(command, str) or "\0" in command:
            raise ValidationError("command", command, "must be a string without NUL bytes")
        if interactive and max(map(len, command.split("\n"))) > MAX_TYPED_LINE:
            raise ValidationError(
                "command",
                command[:80],
                f"an interactive line is typed at a terminal: at most {MAX_TYPED_LINE} "
                "characters a line (a terminal holds 4,095); send longer text as a file",
            )
        action = exec_action(
            shells.resource,
            env,
            record.env.trajectory,
            command,
            cpu,
            elastic=elastic,
            timeout=timeout,
            output_cap=output_cap,
            kind=kind,
            profiles=self.scheduler.profiles,
            now=self._now(),
            session=name,
            interactive=interactive,
            expect=list(expect),
        )
        return await self._submit_in(record, action, shells, "session")

    async def close_session(self, env: str, name: str) -> None:
        """End session `name`: its shell and everything it started are killed."""
        self._env(env)
        await self._shells(env, name).close_session(env, name)
        self._kick()  # its background core may have come back to the pool
        log.info("env %s: session %s closed", env, name)

    def sessions(self, env: str) -> list[str]:
        """The open sessions of environment `env`, by name."""
        self._env(env)
        if self.cpu is None or not hasattr(self.cpu, "sessions_of"):
            return []
        return self.cpu.sessions_of(env)
