"""Allocator registry (`tangram.registry.Registry`): the policies of this package are built-ins,
named as lazy paths below, so a source checkout finds them with no installed metadata; others
(the evaluation's baselines, a third party's) are entry points of the group `tangram.policies`
(pyproject.toml), so this module imports no implementation, least of all one in a higher layer.
`register` adds one programmatically (a user's own policy, a test's)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tangram.allocation import Allocator
from tangram.errors import ValidationError
from tangram.registry import Registry

GROUP = "tangram.policies"

POLICIES: Registry[Callable[..., Allocator]] = Registry(
    "allocator",
    {
        "heuristic": "solvers.heuristic.policy:HeuristicAllocator",
        "backfill": "solvers.heuristic.backfill:BackfillAllocator",
        "backfill-srpt": "solvers.heuristic.backfill:BackfillSrptAllocator",
        "min": "solvers.minimal:MinAllocator",
        "cpsat": "solvers.exact.allocator:CpSatAllocator",
        "pulp": "solvers.exact.allocator:PulpAllocator",
    },
    group=GROUP,
)


def register(name: str) -> Callable[[type], type]:
    """Class decorator: register the policy as `name`."""
    return POLICIES.register(name)  # type: ignore[return-value]


def available() -> list[str]:
    return POLICIES.names()


def runtime_policies() -> list[str]:
    """The registered policies that ship with the scheduler (defined in this package), not
    the evaluation's baselines: what a property about policies runs over, so a new policy is
    covered without editing the test."""
    own = __name__.split(".")[0]
    return [n for n in POLICIES.names() if (POLICIES.module_of(n) or "").split(".")[0] == own]


def get_allocator(name: str, **options: object) -> Allocator:
    """Build the policy registered as `name` with its options (validated, named on error)."""
    cls = POLICIES.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValidationError("allocator", name, f"unknown policy (known: {available()})")
    if dataclasses.is_dataclass(cls):
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        for k in options:
            if k not in fields:
                raise ValidationError(
                    f"allocator.{k}",
                    options[k],
                    f"not an option of {name!r} (options: {sorted(fields)})",
                )
    return cls(**options)
