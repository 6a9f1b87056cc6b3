"""What the facade (`tangram.runtime.facade.Tangram`) keeps per submitted action and per open
environment."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from managers.base import Manager
from tangram.actions import Action

UNKNOWN_ENV = (
    "unknown environment: open one first (environments do not survive a restart of "
    "the server or the scheduler)"
)


@dataclass(slots=True)
class Pending:
    """An action the facade submitted: its caller's future, the manager that runs it."""

    action: Action
    manager: Manager
    future: asyncio.Future
    submitted: float
    started: float = 0.0
    metric_kind: str = "exec"


@dataclass(slots=True)
class EnvEntry:
    """An open environment as the facade tracks it: its trajectory, its queued or running
    actions, when it was last used (the idle reaper's clock)."""

    env_id: str
    trajectory: str
    last_used: float
    running: set[str] = field(default_factory=set)
