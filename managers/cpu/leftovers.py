"""Names that survive a crash: what a server creates carries its PID, so the next server finds
what a dead one left (cgroups, work folders, containers) and sweeps it before serving.

Environments do not survive a restart: their processes are killed and their folders removed.
A PID that was reused by an unrelated live process keeps its leftovers until that process ends
(the sweep errs on the side of never touching a live server's things).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from managers.cpu.removal import remove_tree

PREFIX = "tangram-"
_OWNED = re.compile(r"tangram-(\d+)-[0-9a-z]")


def owned_name(what: str) -> str:
    """`tangram-<this server's pid>-<what>`."""
    return f"{PREFIX}{os.getpid()}-{what}"


def dead_owner(name: str) -> int | None:
    """The PID of the server that named something `tangram-<pid>-...` when that server is gone;
    None when the name is not of that form or its server still runs."""
    m = _OWNED.match(name)
    if m is None:
        return None
    pid = int(m.group(1))
    return pid if gone(pid) else None


def gone(pid: int) -> bool:
    """Whether no process has this PID (in this PID namespace)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


def sweep_workdirs(root: str | Path) -> list[str]:
    """Remove the work folders of dead servers under `root`; returns what was removed."""
    swept = []
    try:
        entries = list(Path(root).iterdir())
    except OSError:
        return swept
    for p in entries:
        pid = dead_owner(p.name)
        if pid is not None and p.is_dir() and not p.is_symlink():
            left = remove_tree(p)
            swept.append(f"{p} (server pid {pid})" + (f"; left: {'; '.join(left)}" if left else ""))
    return swept
