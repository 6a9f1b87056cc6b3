"""Allocator registry: policies register themselves where they are defined; callers resolve
them by name. The runtime never imports a concrete solver module at its top."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

from tangram.allocation import Allocator
from tangram.errors import ValidationError

# modules that define policies; imported on the first lookup
POLICY_MODULES = ("solvers.heuristic.policy", "solvers.minimal", "solvers.exact",
                  "evaluation.baselines")

_REGISTRY: dict[str, Callable[..., Allocator]] = {}
_loaded = False


def register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"allocator {name!r} registered twice")
        _REGISTRY[name] = cls
        return cls
    return deco


def _load() -> None:
    global _loaded
    if _loaded:
        return
    for mod in POLICY_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:  # a missing dependency inside an existing module is a real error
                raise
    _loaded = True


def available() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def get_allocator(name: str, **options: object) -> Allocator:
    """Build the policy registered as `name` with its options (validated, named on error)."""
    _load()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise ValidationError("allocator", name, f"unknown policy (known: {available()})")
    if dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        for k in options:
            if k not in fields:
                raise ValidationError(f"allocator.{k}", options[k],
                                      f"not an option of {name!r} (options: {sorted(fields)})")
    return cls(**options)
