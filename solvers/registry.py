"""Allocator registry: policies are found by name through the entry points of the group
`tangram.policies` (pyproject.toml), so this module names no implementation, least of all one
in a higher layer (the evaluation's baselines). `register` adds one programmatically (a user's
own policy, a test's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from importlib.metadata import entry_points

from tangram.allocation import Allocator
from tangram.errors import ValidationError

GROUP = "tangram.policies"

_REGISTRY: dict[str, Callable[..., Allocator]] = {}


def register(name: str) -> Callable[[type], type]:
    def deco(cls: type) -> type:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"allocator {name!r} registered twice")
        _REGISTRY[name] = cls
        return cls
    return deco


def _installed() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available() -> list[str]:
    return sorted({*_REGISTRY, *_installed()})


def runtime_policies() -> list[str]:
    """The registered policies that ship with the scheduler (defined in this package), not
    the evaluation's baselines: what a property about policies runs over, so a new policy is
    covered without editing the test."""
    own = __name__.split(".")[0]
    names = {n for n, ep in _installed().items()
             if ep.value.split(".")[0] == own}  # type: ignore[attr-defined]
    names |= {n for n, cls in _REGISTRY.items() if cls.__module__.split(".")[0] == own}
    return sorted(names)


def _lookup(name: str) -> Callable[..., Allocator] | None:
    if name in _REGISTRY:
        return _REGISTRY[name]
    ep = _installed().get(name)
    if ep is None:
        return None
    cls = ep.load()  # type: ignore[attr-defined]
    _REGISTRY.setdefault(name, cls)
    return cls


def get_allocator(name: str, **options: object) -> Allocator:
    """Build the policy registered as `name` with its options (validated, named on error)."""
    cls = _lookup(name) if isinstance(name, str) else None
    if cls is None:
        raise ValidationError("allocator", name, f"unknown policy (known: {available()})")
    if dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        for k in options:
            if k not in fields:
                raise ValidationError(f"allocator.{k}", options[k],
                                      f"not an option of {name!r} (options: {sorted(fields)})")
    return cls(**options)
