"""The config file's schema, declared once as pydantic models, and the one way a document is
checked against it (`parse`): a bad key or value is a `tangram.ValidationError` naming its path
(`gpu.services.judge.dops.0`), the value and the problem in the project's words.

Strict types: `true` is not a number, `"8"` is not a count (YAML gives numbers as numbers);
an unknown key is an error naming the keys allowed there.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar, get_origin

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tangram.errors import ValidationError

PosInt = Annotated[int, Field(gt=0)]
NonNegInt = Annotated[int, Field(ge=0)]
PosNum = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegNum = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    def given(self, *names: str) -> bool:
        """Whether the document set any of these keys (not a default)."""
        return any(n in self.model_fields_set for n in names)


class ServiceSpec(Spec):
    """A GPU service: memory per replica, the GPU counts it runs on (its DoPs), and the modelled
    inference and restore times of each."""

    memory_gb: PosNum
    dops: list[PosInt] = Field(default=[1], min_length=1)
    infer_s: dict[int, PosNum] = {}
    restore_s: NonNegNum | None = None
    model: dict[str, Any] | None = None  # TinyLM sizes, for the torch backend

    @field_validator("infer_s", mode="before")
    @classmethod
    def _count_keys(cls, v: Any) -> Any:
        """Keys are GPU counts: YAML gives ints, JSON strings."""
        if isinstance(v, dict):
            return {int(k) if isinstance(k, str) and k.isdigit() else k: x for k, x in v.items()}
        return v

    @field_validator("infer_s")
    @classmethod
    def _among_dops(cls, v: dict[int, float], info: pydantic.ValidationInfo) -> dict[int, float]:
        dops = info.data.get("dops", [1])
        bad = [k for k in v if k not in dops]
        if bad:
            raise ValueError(f"GPU count {bad[0]} is not one of the service's dops {dops}")
        return v


class GpuSpec(Spec):
    """The GPU pool: its backend and size (default: from discovery) and its services."""

    backend: str | None = None  # sim | torch | http; None: torch where NVML finds GPUs
    nodes: PosInt = 1
    gpus_per_node: PosInt = 8
    memory_gb: PosNum = 80.0
    services: dict[str, ServiceSpec] = {}
    options: dict[str, Any] = {}

    @field_validator("gpus_per_node")
    @classmethod
    def _power_of_two(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("must be a power of two")
        return v


class CpuSpec(Spec):
    backend: str = "auto"  # auto | bwrap | cgroup | docker | affinity | sim
    options: dict[str, Any] = {}
    state_dir: str | None = None
    disk_mb: PosInt | None = None
    disk_capacity_mb: PosInt | None = None
    tar_max_mb: PosInt | None = None  # the bound of one files/tar stream
    # a shell session's share of one core between its commands (managers/cpu/shells.py)
    background: Annotated[float, Field(ge=0.01, le=1, allow_inf_nan=False)] | None = None


class ApiSpec(Spec):
    url: str
    method: str = "POST"
    headers: dict[str, str] = {}
    concurrency: PosInt | None = None
    quota: PosInt | None = None
    period_s: PosNum = 1.0
    timeout_s: PosNum = 30.0
    retries: NonNegInt = 0
    backoff_s: NonNegNum = 0.1
    learn: bool = True  # learn the real limit from 429s


class ConfigSpec(Spec):
    """A whole config document (`tangram.runtime.config` shows one)."""

    policy: Any = None  # a name, or {name: ..., <option>: ...}: checked by `check_policy`
    idle_env_s: PosNum | None = None
    cpu: CpuSpec | None = None  # `cpu: false`: no CPU pool (`config.build` reads it first)
    gpu: GpuSpec | None = None
    apis: dict[str, ApiSpec] = {}
    shards: NonNegInt = 0  # node-shard processes of the scheduler (0: one process)


M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], path: str, value: Any) -> M:
    """`value` checked against `model` (None reads as empty); the first problem raised as a
    `ValidationError` at `path` plus the key path inside `value` (`path` "": the document)."""
    try:
        return model.model_validate({} if value is None else value)
    except pydantic.ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        loc = [str(k) for k in err["loc"]]
        where = ".".join(p for p in [path, *loc] if p) or "config"
        raise ValidationError(where, err.get("input"), _problem(err, model, loc)) from None


_WORDS = {
    "missing": "is required",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "list_type": "must be a list",
    "dict_type": "must be a mapping",
    "model_type": "must be a mapping",
    "model_attributes_type": "must be a mapping",
    "finite_number": "must be a finite number",
    "too_short": "must not be empty",
}


def _problem(err: dict[str, Any], model: type[BaseModel], loc: list[str]) -> str:
    kind = err["type"]
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _fields_at(model, loc[:-1])
        return f"unknown key (allowed: {allowed})" if allowed else "unknown key"
    if kind in ("greater_than", "greater_than_equal"):
        return f"must be {'>' if kind == 'greater_than' else '>='} {ctx.get('gt', ctx.get('ge'))}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return _WORDS.get(kind, err["msg"])


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str] | None:
    """The keys the model allows at `loc` (walking models and mappings of models)."""
    current: Any = model
    key_next = False  # the next element of `loc` is a mapping's key
    for key in loc:
        if key_next:
            key_next = False
            continue
        field = current.model_fields.get(key)
        if field is None:
            return None
        key_next = _is_mapping(field.annotation)
        current = _model_in(field.annotation)
        if current is None:
            return None
    return sorted(current.model_fields)


def _is_mapping(annotation: Any) -> bool:
    return get_origin(annotation) is dict or any(
        get_origin(a) is dict for a in getattr(annotation, "__args__", ())
    )


def _model_in(annotation: Any) -> Any:
    """The model an annotation holds: itself, a `dict[str, Model]`'s values, `Model | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
