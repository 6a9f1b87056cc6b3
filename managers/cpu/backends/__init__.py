"""CPU executor backends, resolved by name; `select` picks the best one available and logs why.

Preference (isolation first, then the most faithful enforcement): bwrap (a bubblewrap sandbox
per exec over the cgroup grant; root and bubblewrap), cgroup (cpuset + quota +
memory and pids limits, root, no isolation), docker (container per environment; chosen
automatically only when its image is present), affinity (cpuset only, no root, no isolation),
sim (nothing runs). Each backend skipped is logged with the reason and its fix.

Backends are found by name through a `tangram.registry.Registry`: the built-ins as lazy paths
below (only the chosen backend's module is imported), third parties' as entry points of the
group `tangram.cpu_backends`, run-time ones through `register`.
"""

from __future__ import annotations

import logging

from managers.cpu.backends.base import Backend, EnvironmentBroken
from tangram.errors import BackendUnavailable, ValidationError
from tangram.registry import Registry

log = logging.getLogger("managers.cpu")
PREFERENCE = ("bwrap", "cgroup", "docker", "affinity", "sim")

BACKENDS: Registry[type[Backend]] = Registry("cpu.backend", {
    "bwrap": "managers.cpu.backends.bwrap:BwrapBackend",
    "cgroup": "managers.cpu.backends.cgroup:CgroupBackend",
    "docker": "managers.cpu.backends.docker:DockerBackend",
    "affinity": "managers.cpu.backends.affinity:AffinityBackend",
    "sim": "managers.cpu.backends.sim:SimBackend",
}, group="tangram.cpu_backends")


def register(name: str, cls: type[Backend]) -> None:
    """Add a backend made at run time (a user's own, a test's)."""
    BACKENDS.register(name, cls)


def create(name: str, **options) -> Backend:
    """The backend called `name`; raises `BackendUnavailable` naming the fix."""
    if name not in BACKENDS:
        raise ValidationError("cpu.backend", name, f"unknown backend; known: {BACKENDS.names()}")
    try:
        cls = BACKENDS.get(name)
    except ImportError as exc:
        raise BackendUnavailable(f"CPU backend {name!r} cannot load ({exc})") from None
    assert cls is not None
    return cls(**options)


def select(preferred: str | None = None, **options) -> Backend:
    """`preferred` ("auto" or None: the first of PREFERENCE that starts). Logs the choice and
    the reason each better backend was skipped."""
    if preferred not in (None, "auto"):
        backend = create(preferred, **options)
        log.info("cpu backend: %s (requested)", backend.describe())
        return backend
    skipped = []
    for name in PREFERENCE:
        try:
            backend = create(name, **options)
        except (BackendUnavailable, ImportError, TypeError) as exc:
            skipped.append(f"{name}: {exc}")
            continue
        log.info("cpu backend: %s (auto%s)", backend.describe(),
                 "; skipped " + " | ".join(skipped) if skipped else "")
        return backend
    raise BackendUnavailable("no CPU backend can run: " + " | ".join(skipped))


__all__ = ["BACKENDS", "Backend", "EnvironmentBroken", "PREFERENCE", "create", "register",
           "select"]
