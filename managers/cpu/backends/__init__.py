"""CPU executor backends, resolved by name; `select` picks the best one available and logs why.

Preference (isolation first, then the most faithful enforcement): bwrap (a bubblewrap sandbox
per exec over the cgroup grant; root and bubblewrap), cgroup (cpuset + quota +
memory and pids limits, root, no isolation), docker (container per environment; chosen
automatically only when its image is present), affinity (cpuset only, no root, no isolation),
sim (nothing runs). Each backend skipped is logged with the reason and its fix.
"""

from __future__ import annotations

import logging

from managers.cpu.backends import affinity, bwrap, cgroup, docker, sim  # noqa: F401 (register)
from managers.cpu.backends.base import BACKENDS, Backend, EnvironmentBroken
from tangram.errors import BackendUnavailable, ValidationError

log = logging.getLogger("managers.cpu")
PREFERENCE = ("bwrap", "cgroup", "docker", "affinity", "sim")


def create(name: str, **options) -> Backend:
    """The backend called `name`; raises `BackendUnavailable` naming the fix."""
    cls = BACKENDS.get(name)
    if cls is None:
        raise ValidationError("cpu.backend", name, f"unknown backend; known: {sorted(BACKENDS)}")
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


__all__ = ["BACKENDS", "Backend", "EnvironmentBroken", "PREFERENCE", "create", "select"]
