"""Shell sessions in the CPU manager's environments (`managers.cpu.sessions`): opening and
closing them, and running one command of a session as the action it is.

The grant, per command: the cores the scheduler granted the command are the session's cgroup
slot's for the command alone (cpuset and a quota of all of them, set before the command is
sent); when its prompt returns, the slot goes back to the background allowance. Between
commands the session's processes (a server it started, a watcher) run on the node's
*background cores* with a quota of `background` of one core per environment (default 0.1).
The background cores are taken from the pool (so the scheduler counts them as held and grants
them to no action) while any session is open on the node: ceil(environments with a session x
`background`) of them, at most a quarter of the node's cores (at least one): past that the
environments' allowances share those cores (each still capped at its quota), so nothing runs
outside the accounting. Not frozen between commands: a background server must answer. An
action that demands every core of a node waits while a session is open there.

A mixin of `CpuManager` (its one job: sessions); it needs the manager's table, pool and
`background`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import shlex
from dataclasses import dataclass, field

from managers.cpu.environments import EnvironmentTable, EnvRecord, EnvState
from managers.cpu.request import ExecRequest
from managers.cpu.sessions.shell import (
    MAX_SESSIONS,
    REPLY_GRACE_S,
    SessionGone,
    check_name,
    outcome,
)
from tangram.errors import LimitReached, ValidationError
from tangram.pools import CorePool, Placement
from tangram.results import Result, Status

log = logging.getLogger("managers.cpu")
DEFAULT_BACKGROUND = 0.1  # of one core, per environment with a session open
BACKGROUND_WAIT_S = 30.0  # how long an open waits for a free core to become a background one
OPEN_STATES = (EnvState.IDLE, EnvState.RUNNING)
BACKGROUND_SHARE_OF_NODE = 4  # background cores: at most 1/4 of a node's (at least one)


def check_background(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0.01 <= value <= 1
        or not math.isfinite(value)
    ):
        raise ValidationError("cpu.background", value, "must be a share of one core from 0.01 to 1")
    return float(value)


@dataclass(slots=True)
class BackgroundCores:
    """A node's background cores: the pool's placements held for its sessions' processes,
    and the environments with a session open there."""

    node: str
    held: list[Placement] = field(default_factory=list)
    users: int = 0

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(sorted(c for p in self.held for c in p.cores))


class EnvShells:
    pool: CorePool
    envs: EnvironmentTable
    background: float
    _background: dict[str, BackgroundCores]  # node -> its background cores

    async def open_session(self, env_id: str, name: str) -> None:
        """Start a shell session called `name` in the environment (see the module docstring);
        ValidationError for a bad or taken name, an unknown environment, a backend without
        sessions."""
        check_name(name)
        record = self._session_env(env_id)
        if name in record.sessions:
            raise ValidationError("session", name, f"already open in environment {env_id}")
        if len(record.sessions) >= MAX_SESSIONS:
            raise LimitReached(
                f"environment {env_id} has {MAX_SESSIONS} sessions open (the most it may)"
            )
        record.sessions[name] = None  # taken while it starts
        try:
            bg = await self._join_background(record)
            try:
                session = await record.sandbox.start_session_host(name, bg.cores, self.background)
            except BaseException:
                self._leave_background(record)
                raise
        except BaseException:
            record.sessions.pop(name, None)
            raise
        if record.state in (EnvState.CLOSING, EnvState.CLOSED) or record.sandbox is None:
            await record.sandbox.end_session(session)  # closed meanwhile
            raise ValidationError("env_id", env_id, "the environment was closed")
        record.sessions[name] = session

    async def close_session(self, env_id: str, name: str) -> None:
        """End the session: its shell and everything it started are killed."""
        record = self._session_env(env_id, opening=False)
        session = record.sessions.get(name) if isinstance(name, str) else None
        if session is None:
            raise ValidationError("session", name, f"no open session in environment {env_id}")
        del record.sessions[name]
        async with session.lock:  # a command of it ends first (interrupted at its timeout)
            await record.sandbox.end_session(session)
        self._leave_background(record)

    async def kernel_command(self, env_id: str) -> str:
        """The command that turns a session of the environment into a persistent kernel (its
        driver, with the server's Python, which has ipykernel); ValidationError where the
        sandbox has neither."""
        record = self._session_env(env_id, opening=False)
        driver = record.sandbox.kernel_driver()
        if driver is None:
            raise ValidationError(
                "env_id",
                env_id,
                "a persistent kernel needs the server's Python inside the sandbox (an "
                "environment without an image, on the bwrap backend)",
            )
        return f'"$TANGRAM_PYTHON" -I {driver}'

    def sessions_of(self, env_id: str) -> list[str]:
        record = self.envs.record(env_id)
        return [] if record is None else sorted(n for n, s in record.sessions.items() if s)

    async def end_sessions(self, record: EnvRecord) -> None:
        """Forget every session of an environment being closed or re-stacked (its sandbox
        kills their processes with everything else): files carry over a fork, sessions do
        not."""
        if record.sessions:
            sessions = [s for s in record.sessions.values() if s is not None]
            record.sessions.clear()
            self._leave_background(record)
            for session in sessions:  # (what is left of them goes with the sandbox anyway)
                try:
                    await record.sandbox.end_session(session)
                except OSError as exc:
                    log.warning("env %s: session %s: %s", record.id, session.name, exc)

    async def run_in_session(
        self, record: EnvRecord, req: ExecRequest, cores: tuple[int, ...]
    ) -> Result:
        """One command of a session, granted `cores` for its run alone."""
        session = record.sessions.get(req.session or "")
        if session is None:
            return Result(
                Status.FAILED,
                detail=f"session: no open session {req.session!r} in environment {record.id}",
            )
        sandbox, bg = record.sandbox, record.background
        async with session.lock:
            if session.slot is None:  # closed while this command waited for the one before
                return Result(
                    Status.CANCELLED, detail=f"session {session.name} was closed before it ran"
                )
            ask = {
                "op": "run",
                "command": req.command if isinstance(req.command, str) else _joined(req),
                "timeout": req.timeout,
                "cap": req.output_cap,
                "interactive": req.interactive,
                "expect": list(req.expect),
                "variables": _grant_variables(sandbox, req, cores),
            }
            sandbox.session_cores(session, cores)
            try:
                answer = await session.request(ask, req.timeout + REPLY_GRACE_S)
            except (SessionGone, TimeoutError, OSError, ValueError) as exc:
                answer = {"ok": False, "dead": f"its host does not answer ({exc})"}
            finally:
                if session.slot is not None and bg is not None:
                    sandbox.session_cores(session, bg.cores, self.background)
        if not answer.get("ok") and answer.get("dead"):
            session.dead = str(answer["dead"])
        return outcome(answer, session.name, req.timeout, req.output_cap)

    # -- background cores ------------------------------------------------------------------
    def _session_env(self, env_id: str, opening: bool = True) -> EnvRecord:
        record = self.envs.record(env_id) if isinstance(env_id, str) else None
        if record is None or record.sandbox is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        if opening and record.state not in OPEN_STATES:
            raise ValidationError(
                "env_id", env_id, f"it is {record.state.value}: open a session when it is idle"
            )
        return record

    async def _join_background(self, record: EnvRecord) -> BackgroundCores:
        """Count the environment among its node's session users (once, at its first
        session), taking one more core from the pool when the allowance needs it."""
        if record.background is not None:
            return record.background
        node = record.env.node
        bg = self._background.setdefault(node, BackgroundCores(node))
        need = self._background_need(node, bg.users + 1)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BACKGROUND_WAIT_S
        while len(bg.held) < need:
            if self.pool.free(node) > 0:
                bg.held.append(self.pool.place(1, node=node))
                continue
            if loop.time() > deadline:
                raise LimitReached(
                    f"no core of node {node} came free in {BACKGROUND_WAIT_S:g} s for the "
                    f"background allowance of a session ({self.background:g} of a core per "
                    "environment, cpu.background)"
                )
            await asyncio.sleep(0.05)
        bg.users += 1
        record.background = bg
        return bg

    def _background_need(self, node: str, users: int) -> int:
        """The background cores `users` environments with sessions on `node` hold."""
        cap = max(1, self.pool.capacity(node) // BACKGROUND_SHARE_OF_NODE)
        return min(cap, math.ceil(users * self.background - 1e-9))

    def _leave_background(self, record: EnvRecord) -> None:
        """The environment's last session closed: give back what its allowance no longer
        needs."""
        bg = record.background
        if bg is None or any(record.sessions.values()):
            return
        record.background = None
        bg.users -= 1
        need = self._background_need(bg.node, bg.users) if bg.users else 0
        while len(bg.held) > need:
            self.pool.release(bg.held.pop(), 1)
        if not bg.users:
            self._background.pop(bg.node, None)


def _joined(req: ExecRequest) -> str:
    return shlex.join(req.command)


GRANT_PREFIXES = ("TANGRAM_", "OMP_", "MKL_", "OPENBLAS_", "PYTEST_")


def _grant_variables(sandbox, req: ExecRequest, cores: tuple[int, ...]) -> dict[str, str]:
    """The grant's variables for this command (`grant.command_env`'s cores and threads)."""
    full = sandbox.environ(req.spec(cores))
    return {k: v for k, v in full.items() if k.startswith(GRANT_PREFIXES)}
