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
    """

    env_id: str
    command: Command
    timeout: float = 60.0
    elastic: bool = False
    output_cap: int = DEFAULT_OUTPUT_CAP

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
