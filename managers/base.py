"""The manager interface (paper 5): what the runtime needs from every manager.

A manager owns the pools of some resource types and runs the actions placed on them. Two things
sit behind it: the *pool logic* (which units are free, placement, caches) which is pure and shared
by simulation and production, and an *executor backend* that does the side effects (a process in
a cgroup, a container exec, a GPU restore, an HTTP request) or, for `sim`, only models time.

The scheduler decides *how many units and where* (an `Assignment`); the manager then enforces
exactly that grant while the action runs and returns an `Outcome`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tangram.allocation import Assignment
from tangram.pools import Pool

STATUSES = ("ok", "error", "timeout", "failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What running one action produced.

    status: "ok" (ran, exit 0 / HTTP 2xx), "error" (ran and failed: non-zero exit, HTTP error),
    "timeout" (killed at its deadline), "failed" (could not run: environment broken, backend
    down), "cancelled". `detail` says what happened in words a user understands.
    """

    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: Any = None
    detail: str = ""
    restore_s: float = 0.0
    truncated: bool = False


class Manager(ABC):
    """Owns the pools of its resource types; runs actions placed on them."""

    name: str = "manager"

    @abstractmethod
    def pools(self) -> Mapping[str, Pool]:
        """Pool state objects; the scheduler applies assignments to these very objects."""

    @abstractmethod
    async def run(self, assignment: Assignment) -> Outcome:
        """Run one placed action, enforcing exactly its granted units; never raise for the
        action's own failure (that is an `Outcome`)."""

    async def close(self) -> None:
        """Release everything (processes, cgroups, containers). Idempotent."""
