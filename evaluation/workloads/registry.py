"""Workload registry (`tangram.registry.Registry`, the mechanism of every family): the paper's
generators are built-ins named as lazy paths below, third parties' are entry points of the
group `tangram.workloads`, run-time ones come through `register`."""

from __future__ import annotations

from collections.abc import Callable

from tangram.errors import ValidationError
from tangram.registry import Registry

WORKLOADS: Registry[Callable] = Registry(
    "workload",
    {
        "coding": "evaluation.workloads.coding:coding",
        "deepsearch": "evaluation.workloads.gpu:deepsearch",
        "mopd": "evaluation.workloads.gpu:mopd",
        "mopd+search": "evaluation.workloads.gpu:mopd_search",
        "mixed": "evaluation.workloads.mixed:mixed",
    },
    group="tangram.workloads",
)


def register(name: str) -> Callable[[Callable], Callable]:
    """Decorator: register a generator made at run time as `name`."""
    return WORKLOADS.register(name)  # type: ignore[return-value]


def get_workload(name: str, **params):
    fn = WORKLOADS.get(name) if isinstance(name, str) else None
    if fn is None:
        raise ValidationError("workload", name, f"unknown workload (known: {available()})")
    return fn(**params)


def available() -> list[str]:
    return WORKLOADS.names()
