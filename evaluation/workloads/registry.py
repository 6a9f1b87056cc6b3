"""Workload registry: each generator registers itself by name where it is defined."""

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
    import evaluation.workloads  # noqa: F401  (registers the generators)

    fn = _WORKLOADS.get(name)
    if fn is None:
        raise ValidationError("workload", name, f"unknown workload (known: {sorted(_WORKLOADS)})")
    return fn(**params)


def available() -> list[str]:
    import evaluation.workloads  # noqa: F401

    return sorted(_WORKLOADS)
