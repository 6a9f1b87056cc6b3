"""The records of what happened to an action.

`Result`: the one record every action produces, from the manager that ran it, through the
facade, to the HTTP response: what happened (`status`, output) and, filled in by the runtime,
what was granted (`units`, `placement`) and when (`queued_s`, `run_s`).

`ScheduledAction`: one action of a schedule, on a timeline: when it arrived, started and
ended, with what and where. The simulator's engine records one per action it ran, the exact
solvers return them as their schedule, the work-conservation checker replays them, and the GPU
trace reports them with what each restore evicted: one record, so a schedule one of them makes
is a schedule the others read."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any

from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import Placement


class Status(StrEnum):
    """How an action ended. The values are the JSON strings of the HTTP API."""

    OK = "ok"  # ran and succeeded: exit 0, HTTP 2xx, an inference answered
    ERROR = "error"  # ran and failed: non-zero exit, an HTTP error, an exception in the service
    TIMEOUT = "timeout"  # ran past its deadline and was killed (its whole process tree)
    FAILED = "failed"  # could not run: environment lost or broken, backend or node down
    CANCELLED = "cancelled"  # never finished: its caller went away, its env closed, shutdown


@dataclass(frozen=True, slots=True)
class Result:
    """status: see `Status`; `detail` says what happened in words a user understands.
    A manager fills the first group (what running produced); the runtime adds the action's id,
    its grant (`units`, `placement`) and its timings: `queued_s` submission to start, `run_s`
    start to end (a GPU service's restore included, also reported as `restore_s`)."""

    status: Status
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    output: Any = None
    detail: str = ""
    restore_s: float = 0.0
    truncated: bool = False
    action_id: str = ""
    units: Mapping[str, int] = field(default_factory=dict)
    placement: Mapping[str, Placement] = field(default_factory=dict)
    queued_s: float = 0.0
    run_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.status, Status):  # a bug, not input: input goes through parse
            raise TypeError(f"Result.status must be a Status, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def act_s(self) -> float:
        return self.queued_s + self.run_s

    def granted(
        self,
        action_id: str,
        units: Mapping[str, int],
        placement: Mapping[str, Placement],
        queued_s: float,
        run_s: float,
    ) -> Result:
        """This result with what the runtime knows: the action, its grant and its timings."""
        output = self.output
        if dataclasses.is_dataclass(output) and not isinstance(output, type):
            output = asdict(output)
        return dataclasses.replace(
            self,
            action_id=action_id,
            units=dict(units),
            placement=dict(placement),
            queued_s=queued_s,
            run_s=run_s,
            output=output,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON document of the HTTP API (the edge where placements become plain data)."""
        d = asdict(self)
        d["status"] = str(self.status)
        d["units"] = dict(self.units)
        d["placement"] = {r: placement_json(p) for r, p in self.placement.items()}
        return d

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Result:
        """`to_dict`'s inverse, for what comes back over the wire: the status is parsed once
        here (an unknown one raises `ValidationError` naming it); unknown keys are ignored."""
        known = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__}
        known["status"] = parse_status(doc.get("status"))
        known["placement"] = {
            r: parse_placement(f"placement.{r}", p) for r, p in (doc.get("placement") or {}).items()
        }
        return cls(**known)


@dataclass(frozen=True, slots=True)
class ScheduledAction:
    """One action of a schedule: the `action` as it ran (in a simulation its truth, not what
    the scheduler was shown), submitted at `arrival`, running from `start` to `end` (seconds
    on the schedule's clock; `end - start` includes a GPU service's restore) with `units` of
    each resource at its `placement` (empty where its maker knows none). Its ACT is
    `end - arrival`.

    What only some schedules know has a default: how it ended (`status`; TIMEOUT: killed at its
    `Action.timeout`), whether a GPU service call `restored` its service first (None: no
    service, or not modelled) and which services that restore `evicted` (the GPU trace)."""

    action: Action
    arrival: float
    start: float
    end: float
    units: Mapping[str, int]
    placement: Mapping[str, Placement] = field(default_factory=dict)
    status: Status = Status.OK
    restored: bool | None = None
    evicted: tuple[str, ...] = ()

    @property
    def action_id(self) -> str:
        return self.action.id

    def assignment(self) -> Assignment:
        """The grant this record ran with, as the invariant checker takes one."""
        return Assignment(self.action, self.units, self.placement)


def parse_status(value: object, field: str = "status") -> Status:
    """The `Status` a string names; `ValidationError` naming `field` and the value otherwise."""
    try:
        return Status(value)
    except ValueError:
        raise ValidationError(field, value, f"not a status (one of {', '.join(Status)})") from None


def placement_json(p: Placement) -> dict[str, Any]:
    """A placement as JSON: {"node", "cores": [...], "chunk": [start, size] or null}."""
    return {"node": p.node, "cores": list(p.cores), "chunk": list(p.chunk) if p.chunk else None}


def parse_placement(field: str, doc: Any) -> Placement:
    """`placement_json`'s inverse; `ValidationError` naming `field` on a malformed document."""
    try:
        chunk = doc.get("chunk")
        return Placement(
            str(doc["node"]),
            tuple(int(c) for c in doc.get("cores") or ()),
            None if chunk is None else (int(chunk[0]), int(chunk[1])),
        )
    except (AttributeError, KeyError, IndexError, TypeError, ValueError):
        raise ValidationError(field, doc, "not a placement {node, cores, chunk}") from None
