"""Tangram's pytest plugin for elastic runs: use the granted cores as xdist workers.

Loaded through `PYTEST_PLUGINS` in an elastic exec. Adds `-n $TANGRAM_CPUS` to pytest's
arguments when pytest-xdist is importable, more than one core was granted, and the command
chose no `-n`/`--numprocesses`/`-p no:xdist` itself. Otherwise it does nothing, so a python
without xdist runs the suite serially instead of failing on an unknown `-n`.
Standalone on purpose: it runs inside sandboxes, where Tangram itself is not importable.
"""

from __future__ import annotations

import importlib.util
import os


def workers_to_add(args: list[str], cpus: str | None, xdist: bool, in_worker: bool) -> int:
    """How many xdist workers to ask for (0: leave the arguments alone)."""
    if not xdist or in_worker or not cpus or not cpus.isdigit() or int(cpus) < 2:
        return 0
    for i, a in enumerate(args):
        if a in ("-n", "--numprocesses") or a.startswith(("--numprocesses=", "--dist")):
            return 0
        if a.startswith("-n") and a[2:].strip("=").isalnum():
            return 0
        if a == "-p" and i + 1 < len(args) and args[i + 1] == "no:xdist":
            return 0
        if a == "-pno:xdist":
            return 0
    return int(cpus)


def xdist_importable() -> bool:
    try:
        return importlib.util.find_spec("xdist") is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as none
        return False


def pytest_load_initial_conftests(args: list[str]) -> None:
    n = workers_to_add(
        list(args),
        os.environ.get("TANGRAM_CPUS"),
        xdist_importable(),
        "PYTEST_XDIST_WORKER" in os.environ,
    )
    if n:
        args[:] = ["-n", str(n), *args]
