"""The native API's request and response bodies (`/v1/...`), strict: a wrong type or an unknown
field is a 422 naming it. Their bounds are `tangram.runtime.http.limits`'."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.runtime import sandboxfusion
from tangram.runtime.http import env_routes
from tangram.runtime.http.limits import (
    MAX_ARGV,
    MAX_COMMAND,
    MAX_OUTPUT_CAP,
    Choices,
    MemoryMb,
    Name,
    Seconds,
    Units,
)


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class UnitRange(_Body):
    """Any amount from `min` to `max` units (inclusive)."""

    min: Units
    max: Units


Demand = Units | UnitRange | Choices


def demand_arg(d: Demand) -> Any:
    """The Python API's form of a demand: a range is a (lo, hi) tuple."""
    return (d.min, d.max) if isinstance(d, UnitRange) else d


class OpenEnv(_Body):
    trajectory: Name
    memory_mb: MemoryMb = 1024
    network: bool = False
    image: Name | None = None
    disk_mb: MemoryMb | None = None
    snapshot: Name | None = None


class Exec(_Body):
    command: (
        Annotated[str, Field(min_length=1, max_length=MAX_COMMAND)]
        | Annotated[
            list[Annotated[str, Field(max_length=MAX_COMMAND)]],
            Field(min_length=1, max_length=MAX_ARGV),
        ]
    )
    cpu: Demand = 1
    gpus: Demand | None = None  # a GPU chunk too, in the same action (`Tangram.exec`)
    elastic: bool = False
    timeout: Seconds = 60.0
    output_cap: Annotated[int, Field(ge=0, le=MAX_OUTPUT_CAP)] | None = None  # bytes kept
    kind: Name | None = None  # the caller's name for the action (keys shared estimates)

    @field_validator("command")
    @classmethod
    def _no_nul(cls, v: str | list[str]) -> str | list[str]:
        if any("\x00" in s for s in ([v] if isinstance(v, str) else v)):
            raise ValueError("must not contain NUL characters")
        return v


class Invoke(_Body):
    payload: Any = None
    gpus: Demand = 1


class CallApi(_Body):
    payload: Any = None


# every field name a body may carry: an error's `field` is cut at the first part that is not one
FIELDS = (
    {f for m in (OpenEnv, Exec, Invoke, CallApi, UnitRange) for f in m.model_fields}
    | sandboxfusion.FIELDS
    | env_routes.FIELDS
)


class EnvOut(BaseModel):
    env_id: str


class ErrorOut(BaseModel):
    error: str
    field: str | None = None
    value: Any = None
    problem: str | None = None


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut} for code in (401, 404, 408, 409, 413, 422, 429, 503)
}
