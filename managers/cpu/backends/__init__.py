"""CPU executor backends, resolved by name; `started` starts one (or, for "auto", the best that
starts here) and logs why each better one was skipped.

Preference (isolation first, then the most faithful enforcement): bwrap (a bubblewrap sandbox
per exec over the cgroup grant; root and bubblewrap), cgroup (cpuset + quota +
memory and pids limits, root, no isolation), docker (container per environment; chosen
automatically only when its image is present), affinity (cpuset only, no root, no isolation),
sim (nothing runs). Each backend skipped is logged with the reason and its fix.

Backends are found by name through a `tangram.registry.Registry`: the built-ins as lazy paths
below (only the chosen backend's module is imported), third parties' as entry points of the
group `tangram.cpu_backends`, run-time ones through `register`.

`create` builds a backend without touching the system (no process, cgroup or file: see
`base`); `started` (or the manager's `start`) probes and prepares it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

from managers.cpu.backends.base import Backend, EnvironmentBroken, NotStarted
from tangram.errors import BackendUnavailable, ValidationError
from tangram.registry import Registry

log = logging.getLogger("managers.cpu")
PREFERENCE = ("bwrap", "cgroup", "docker", "affinity", "sim")
AUTO = "auto"

BACKENDS: Registry[type[Backend]] = Registry(
    "cpu.backend",
    {
        "bwrap": "managers.cpu.backends.bwrap:BwrapBackend",
        "cgroup": "managers.cpu.backends.cgroup:CgroupBackend",
        "docker": "managers.cpu.backends.docker:DockerBackend",
        "affinity": "managers.cpu.backends.affinity:AffinityBackend",
        "sim": "managers.cpu.backends.sim:SimCpuBackend",
    },
    group="tangram.cpu_backends",
)


def register(name: str, cls: type[Backend]) -> None:
    """Add a backend made at run time (a user's own, a test's)."""
    BACKENDS.register(name, cls)


def options_of(name: str) -> frozenset[str] | None:
    """The options (constructor keywords) the backend `name` takes; None when it takes any."""
    params = inspect.signature(_backend_class(name)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return frozenset(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


def unknown_options(name: str, options: Mapping[str, Any]) -> list[str]:
    """The options in `options` that the backend `name` does not take, sorted."""
    known = options_of(name)
    return [] if known is None else sorted(set(options) - known)


def _backend_class(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise ValidationError("cpu.backend", name, f"unknown backend; known: {BACKENDS.names()}")
    try:
        cls = BACKENDS.get(name)
    except ImportError as exc:
        raise BackendUnavailable(f"CPU backend {name!r} cannot load ({exc})") from None
    assert cls is not None
    return cls


def create(name: str, **options) -> Backend:
    """The backend called `name`; raises `ValidationError` for an unknown name or option and
    `BackendUnavailable` naming the fix."""
    cls = _backend_class(name)
    unknown = unknown_options(name, options)
    if unknown:
        raise ValidationError(
            "cpu.options",
            unknown,
            f"not options of the {name} backend "
            f"(it takes: {', '.join(sorted(options_of(name) or ())) or 'none'})",
        )
    return cls(**options)


async def started(preferred: str | None = None, **options) -> Backend:
    """The backend `preferred`, started; "auto" or None: the first of PREFERENCE that starts
    with these options. Logs the choice and the reason each better backend was skipped;
    raises `BackendUnavailable` naming the fix."""
    if preferred not in (None, AUTO):
        backend = create(preferred, **options)
        await backend.start()
        log.info("cpu backend: %s (requested)", backend.describe())
        _say_if_unisolated(backend)
        return backend
    skipped = []
    for name in PREFERENCE:
        try:
            unknown = unknown_options(name, options)
            if unknown:
                skipped.append(f"{name}: does not take {', '.join(unknown)}")
                continue
            backend = create(name, **options)
            await backend.start()
        except (BackendUnavailable, ValidationError, ImportError) as exc:
            skipped.append(f"{name}: {exc}")
            continue
        log.info(
            "cpu backend: %s (auto%s)",
            backend.describe(),
            "; skipped " + " | ".join(skipped) if skipped else "",
        )
        _say_if_unisolated(backend, skipped)
        return backend
    raise BackendUnavailable("no CPU backend can run: " + " | ".join(skipped))


def _say_if_unisolated(backend: Backend, skipped: list[str] | None = None) -> None:
    """A WARNING where commands will run unisolated (on the host, as the server's user),
    naming why no isolating backend was chosen: a user must not learn it from INFO logs."""
    if backend.isolates or backend.name == "sim":  # (sim runs nothing)
        return
    why = f"; not chosen: {' | '.join(skipped)}" if skipped else ""
    log.warning(
        "cpu backend %s does not isolate: commands run on the host as the server's user, "
        "they can read its files and reach each other (the bwrap backend isolates: bubblewrap "
        "with root, or without root a subordinate uid range and a delegated cgroup subtree: "
        "docs/rootless.md)%s",
        backend.name,
        why,
    )


__all__ = [
    "AUTO",
    "BACKENDS",
    "Backend",
    "EnvironmentBroken",
    "NotStarted",
    "PREFERENCE",
    "create",
    "options_of",
    "register",
    "started",
    "unknown_options",
]
