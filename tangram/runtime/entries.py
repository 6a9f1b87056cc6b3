"""What the facade (`tangram.runtime.facade.Tangram`) keeps per submitted action (an open
environment's own record is the CPU manager's: `managers.cpu.environments.EnvRecord`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

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
