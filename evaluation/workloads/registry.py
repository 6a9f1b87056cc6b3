"""Workload registry: each generator registers itself by name where it is defined; importing
`evaluation.workloads` imports every generator, so look-ups go through that package."""

from __future__ import annotations

from collections.abc import Callable

from tangram.errors import ValidationError

_WORKLOADS: dict[str, Callable] = {}


def register(name: str) -> Callable[[Callable], Callable]:
    def deco(fn: Callable) -> Callable:
        _WORKLOADS[name] = fn
        return fn
    return deco


def get_workload(name: str, **params):
    fn = _WORKLOADS.get(name)
    if fn is None:
        raise ValidationError("workload", name, f"unknown workload (known: {sorted(_WORKLOADS)})")
    return fn(**params)


def available() -> list[str]:
    return sorted(_WORKLOADS)
