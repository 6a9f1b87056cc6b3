"""CPU executor backends, resolved by name; `started` starts one (or, for "auto", the best that
starts here) and logs why each better one was skipped.

Preference (isolation first, then the most faithful enforcement): bwrap (a bubblewrap sandbox
per exec over the cgroup grant; root and bubblewrap), cgroup (cpuset + quota +
memory and pids limits, root, no isolation), docker (container per environment; chosen
automatically only when its image is present), affinity (cpuset only, no root, no isolation),
sim (nothing runs). Each backend skipped is logged with the reason and its fix.

`create` builds a backend without touching the system (no process, cgroup or file: see
`base`); `started` (or the manager's `start`) probes and prepares it.
"""

from __future__ import annotations

import inspect
import logging

from managers.cpu.backends import affinity, bwrap, cgroup, docker, sim  # noqa: F401 (register)
from managers.cpu.backends.base import BACKENDS, Backend, EnvironmentBroken, NotStarted
from tangram.errors import BackendUnavailable, ValidationError

log = logging.getLogger("managers.cpu")
PREFERENCE = ("bwrap", "cgroup", "docker", "affinity", "sim")
AUTO = "auto"


def create(name: str, **options) -> Backend:
    """The backend called `name`, not started; an unknown name or option raises
    `ValidationError` naming what the backend takes."""
    cls = BACKENDS.get(name)
    if cls is None:
        raise ValidationError("cpu.backend", name, f"unknown backend; known: {sorted(BACKENDS)}")
    takes = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise ValidationError("cpu.options", unknown, f"not options of the {name} backend; it "
                              f"takes {takes or 'none'}")
    return cls(**options)


async def started(preferred: str | None = None, **options) -> Backend:
    """The backend `preferred`, started; "auto" or None: the first of PREFERENCE that starts
    with these options. Logs the choice and the reason each better backend was skipped;
    raises `BackendUnavailable` naming the fix."""
    if preferred not in (None, AUTO):
        backend = create(preferred, **options)
        await backend.start()
        log.info("cpu backend: %s (requested)", backend.describe())
        return backend
    skipped = []
    for name in PREFERENCE:
        try:
            backend = create(name, **options)
            await backend.start()
        except (BackendUnavailable, ValidationError) as exc:
            skipped.append(f"{name}: {exc}")
            continue
        log.info("cpu backend: %s (auto%s)", backend.describe(),
                 "; skipped " + " | ".join(skipped) if skipped else "")
        return backend
    raise BackendUnavailable("no CPU backend can run: " + " | ".join(skipped))


__all__ = ["AUTO", "BACKENDS", "Backend", "EnvironmentBroken", "NotStarted", "PREFERENCE",
           "create", "started"]
