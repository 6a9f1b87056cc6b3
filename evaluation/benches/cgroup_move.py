"""How long moving a process into a cgroup takes after the machine was idle for a moment, the
step every exec makes (`tangram bench exec` prints it): the kernel takes a lock shared by every
hierarchy, which without the `favordynmods` cgroup option waits for an RCU grace period when
no move happened recently (`managers.cpu.backends.cgroup.fs.favor_dynmods`). Needs root and a
cpu cgroup hierarchy; moves this process between two folders of its own, then back."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import uuid
from pathlib import Path

from managers.cpu.backends.cgroup.backend import fs as cgroupfs

GAP_S = 0.05


def _cpu_root() -> Path | None:
    for root in (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")):
        if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
            return root
    return None


def move_after_idle_ms(n: int = 12) -> tuple[float, bool] | None:
    """The median time of one move after `GAP_S` idle, and whether favordynmods is set; None
    where this process cannot make cgroups."""
    root = _cpu_root()
    if root is None:
        return None
    top = root / f"tangram-move-probe-{uuid.uuid4().hex[:8]}"
    folders = [top / "a", top / "b"]
    own = root / (cgroupfs._own_paths().get("cpu", "/").lstrip("/") or ".")
    samples: list[float] = []
    try:
        for f in folders:
            f.mkdir(parents=True)
        for i in range(n):
            time.sleep(GAP_S)
            t = time.perf_counter()
            (folders[i % 2] / "cgroup.procs").write_text("0")
            samples.append((time.perf_counter() - t) * 1e3)
    except OSError:
        return None
    finally:
        with contextlib.suppress(OSError):
            (own / "cgroup.procs").write_text("0")
        for f in (*folders, top):
            with contextlib.suppress(OSError):
                f.rmdir()
    return statistics.median(samples), _favored()


def _favored() -> bool:
    found = cgroupfs.cgroup2_mount()
    return found is not None and cgroupfs.FAVOR in found[2]
