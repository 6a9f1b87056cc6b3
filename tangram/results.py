"""What every Tangram call returns: the action's outcome with its timings and its grant."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Result:
    """status: "ok" | "error" (ran and failed) | "timeout" | "failed" (could not run) |
    "cancelled". queued_s: submission to start; run_s: start to end (restore included);
    units/placement: what the scheduler granted."""

    action_id: str
    status: str
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: Any = None
    detail: str = ""
    units: Mapping[str, int] = field(default_factory=dict)
    placement: Mapping[str, Any] = field(default_factory=dict)
    queued_s: float = 0.0
    run_s: float = 0.0
    restore_s: float = 0.0
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def act_s(self) -> float:
        return self.queued_s + self.run_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["units"] = dict(self.units)
        d["placement"] = {r: dict(p) if isinstance(p, Mapping) else p
                          for r, p in self.placement.items()}
        return d
