"""What a CPU action runs: `ExecRequest`, the payload of an action on the `cpu` pool.

Pure helpers live here too: turning a command into an argv. The command text is never rewritten:
an elastic run learns its degree of parallelism from its environment (`grant`, paper 5.2).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tangram.errors import ValidationError
from tangram.results import Result, Status

Command = str | tuple[str, ...]
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes kept per stream


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """Run `command` in environment `env_id`.

    `command`: a shell string (run with `sh -c`) or an argv tuple (run directly). `timeout` (s):
    the whole process tree is killed at the deadline. `elastic`: pytest gets `-n <granted
    cores>` where pytest-xdist is importable (through a plugin, see `grant`; never by rewriting
    the command). `output_cap`: bytes kept of stdout and of stderr each; the rest is
    drained and dropped, and the outcome says it was truncated.

    A vector exec also demands a GPU chunk: `gpu_resource` names the GPU pool whose placement
    in the assignment is the command's GPUs, `gpu_node` the node of that pool that is the
    environment's machine (the manager refuses a grant elsewhere). None: no GPU.
    """

    env_id: str
    command: Command
    timeout: float = 60.0
    elastic: bool = False
    output_cap: int = DEFAULT_OUTPUT_CAP
    gpu_resource: str | None = None
    gpu_node: str | None = None
    session: str | None = None  # run in this shell session of the environment (`sessions`)
    interactive: bool = False  # typed into the program that holds the session's terminal
    expect: tuple[str, ...] = ()  # prompts that end an interactive request

    def __post_init__(self) -> None:
        if not isinstance(self.env_id, str) or not self.env_id:
            raise ValidationError("exec.env_id", self.env_id, "must be an environment id")
        cmd = self.command
        if isinstance(cmd, Sequence) and not isinstance(cmd, str):
            cmd = tuple(cmd)
            if not cmd or not all(isinstance(a, str) for a in cmd):
                raise ValidationError(
                    "exec.command", self.command, "an argv must be a non-empty sequence of strings"
                )
            object.__setattr__(self, "command", cmd)
        elif not isinstance(cmd, str) or not cmd.strip():
            raise ValidationError("exec.command", cmd, "must be a non-empty string or argv")
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise ValidationError("exec.timeout", t, "must be a finite positive number of seconds")
        cap = self.output_cap
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
            raise ValidationError("exec.output_cap", cap, "must be a non-negative integer (bytes)")
        if self.session is None and (self.interactive or self.expect):
            raise ValidationError("session", None, "interactive and expect need a session")
        if self.session is not None and self.gpu_resource is not None:
            raise ValidationError("gpus", self.gpu_node, "a session's command takes no GPUs")
        if not isinstance(self.expect, tuple) or not all(
            isinstance(e, str) and e and "\0" not in e for e in self.expect
        ):
            raise ValidationError("expect", self.expect, "must be a list of non-empty strings")
        if (self.gpu_resource is None) != (self.gpu_node is None):
            raise ValidationError(
                "gpus", self.gpu_node, "a GPU grant names both its pool and its node"
            )

    def spec(self, cores: tuple[int, ...], gpus: tuple[int, ...] = ()) -> ExecSpec:
        """What a sandbox runs for this request, granted `cores` (and `gpus`)."""
        return ExecSpec(self.command, cores, self.timeout, self.output_cap, self.elastic, gpus)


@dataclass(frozen=True, slots=True)
class ExecSpec:
    """One command as a sandbox runs it (`managers.cpu.backends.base.Sandbox.exec`): the
    `command` (a shell string or an argv), the `cores` it is confined to and the `gpus` (host
    indices) it was granted, killed with its whole process tree after `timeout` seconds, at
    most `output_cap` bytes of stdout and of stderr kept; `elastic`: pytest learns the cores
    (see `grant`). The variables it sees are the grant's, never the server's
    (`grant.command_env`). Built once per exec from the action's `ExecRequest` and its grant
    (`ExecRequest.spec`); every backend, and the spawner inside a sandbox, reads this one
    value."""

    command: Command
    cores: tuple[int, ...]
    timeout: float
    output_cap: int
    elastic: bool = False
    gpus: tuple[int, ...] = ()

    @property
    def argv(self) -> list[str]:
        return argv_of(self.command)


def gpu_grant(assignment: Any, req: ExecRequest, node: str) -> tuple[int, ...] | Result:
    """The GPUs (host indices) an exec of an environment on `node` (the CPU pool's) was
    granted: () without a GPU demand; the failed `Result` naming `gpus` when the assignment
    holds no chunk of the request's GPU pool on the environment's machine."""
    if req.gpu_resource is None:
        return ()
    placement = assignment.placement.get(req.gpu_resource)
    if placement is None or placement.chunk is None or placement.node != req.gpu_node:
        return Result(
            Status.FAILED,
            detail=f"gpus: action {assignment.action_id}: placement {placement} is not a "
            f"chunk of {req.gpu_resource!r} on {req.gpu_node}, the machine of its "
            f"environment (node {node})",
        )
    return tuple(range(*placement.chunk))


def exec_target(assignment: Any, envs: Any) -> tuple[ExecRequest, Any] | Result:
    """The action's `ExecRequest` and its open environment (looked up in `envs` by id), or the
    failed `Result` that says which is missing. Shared by every CPU manager's `run`."""
    req = assignment.action.payload
    if not isinstance(req, ExecRequest):
        return Result(
            Status.FAILED,
            detail=f"action {assignment.action_id}: payload must be an "
            f"ExecRequest, got {type(req).__name__}",
        )
    env = envs.get(req.env_id)
    if env is None:
        return Result(Status.FAILED, detail=f"exec.env_id: no open environment {req.env_id!r}")
    return req, env


def argv_of(command: Command) -> list[str]:
    """A shell string runs under `sh -c`; an argv runs as it is."""
    return ["sh", "-c", command] if isinstance(command, str) else list(command)


def describe(command: Command) -> str:
    return command if isinstance(command, str) else shlex.join(command)
