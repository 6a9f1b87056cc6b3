"""The cgroup filesystem, v1 and v2: find it, and lay out Tangram's cgroups in it.

Layout (one `tangram-<tag>` folder per backend instance, under this process's own cgroup in v1
and under the v2 root, or `TANGRAM_CGROUP_PARENT`, in v2):

    tangram-<tag>/<env>/          the environment: memory limit, CPU accounting, all node cores
    tangram-<tag>/<env>/x<i>/     an exec slot: cpuset and CPU quota of exactly the granted cores

v1 keeps a copy of this tree in each controller's hierarchy (cpu, cpuacct, cpuset; memory holds
only the environment level); v2 has one tree with cpu, cpuset and memory enabled down to slots.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tangram.errors import BackendUnavailable

CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
V2_CONTROLLERS = ("cpu", "cpuset", "memory")
PERIOD_US = 100_000
FIX = "or choose backend='affinity' (no root, cpuset only) or 'docker'"


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where Tangram's tree lives: v1 one base per controller, v2 one base for all."""

    version: int
    bases: dict[str, Path]  # controller -> the tangram-<tag> folder

    def base(self, controller: str) -> Path:
        return self.bases[controller]

    def distinct(self, controllers: tuple[str, ...] = CONTROLLERS) -> list[Path]:
        seen: list[Path] = []
        for c in controllers:
            if c in self.bases and self.bases[c] not in seen:
                seen.append(self.bases[c])
        return seen


def _mounts() -> tuple[dict[str, Path], Path | None]:
    v1: dict[str, Path] = {}
    v2: Path | None = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype, _, opts = (right.split() + ["", "", ""])[:3]
            mountpoint = Path(left.split()[4])
            if fstype == "cgroup2" and v2 is None:
                v2 = mountpoint
            elif fstype == "cgroup":
                for opt in opts.split(","):
                    if opt in CONTROLLERS:
                        v1.setdefault(opt, mountpoint)
    return v1, v2


def _own_paths() -> dict[str, str]:
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else ["unified"]:
                own[c] = path
    return own


def detect(tag: str, parent: str | None = None) -> Hierarchy:
    """The hierarchy to use (v2 when it has the controllers, else v1); raises
    `BackendUnavailable` with the fix when there is none usable."""
    if os.geteuid() != 0:
        raise BackendUnavailable(f"the cgroup backend needs root to create cgroups (running as "
                                 f"uid {os.geteuid()}): run as root, {FIX}")
    try:
        v1, v2 = _mounts()
        own = _own_paths()
    except OSError as exc:
        raise BackendUnavailable(f"cannot read the cgroup mounts ({exc}): mount /sys/fs/cgroup "
                                 f"and /proc, {FIX}") from exc
    parent = parent or os.environ.get("TANGRAM_CGROUP_PARENT") or None
    if v2 is not None:
        try:
            available = set((v2 / "cgroup.controllers").read_text().split())
        except OSError:
            available = set()
        if set(V2_CONTROLLERS) <= available and not (set(V2_CONTROLLERS) & set(v1)):
            root = Path(parent) if parent else v2
            return Hierarchy(2, {c: root / f"tangram-{tag}" for c in CONTROLLERS})
    missing = [c for c in CONTROLLERS if c not in v1]
    if missing:
        raise BackendUnavailable(
            f"no usable cgroup hierarchy: cgroup v2 lacks the cpu/cpuset/memory controllers and "
            f"cgroup v1 lacks {', '.join(missing)}: mount them (e.g. `mount -t cgroup -o "
            f"{','.join(missing)} cgroup /sys/fs/cgroup/{missing[0]}`), {FIX}")
    bases = {}
    for c in CONTROLLERS:
        below = Path(parent) if parent else v1[c] / own.get(c, "/").lstrip("/")
        bases[c] = below / f"tangram-{tag}"
    return Hierarchy(1, bases)


def write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read(path: Path) -> str:
    with open(path) as f:
        return f.read().strip()


def pids(folder: Path) -> list[int]:
    try:
        return [int(p) for p in read(folder / "cgroup.procs").split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def kill_all(folder: Path, keep: int | None = None, wait_s: float = 1.0) -> None:
    """SIGKILL every process in `folder` but `keep`, and wait (at most `wait_s`) until they
    have left it, so the cores they ran on are really free when this returns."""
    if keep is None and (folder / "cgroup.kill").exists():
        with contextlib.suppress(OSError):
            write(folder / "cgroup.kill", "1")
    deadline = time.monotonic() + wait_s
    pause = 0.0005
    while True:  # a process may fork while we read; go round until the folder is empty
        found = [p for p in pids(folder) if p != keep]
        if not found or time.monotonic() > deadline:
            return
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


def cpulist(cores: tuple[int, ...]) -> str:
    return ",".join(str(c) for c in cores)



def folders_of(pid: int) -> dict[str, Path]:
    """The cgroup folder holding `pid`, per controller (cpu, cpuacct, cpuset, memory; the one
    v2 folder under every name). Empty when /proc or the mounts cannot be read."""
    try:
        v1, v2 = _mounts()
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    found: dict[str, Path] = {}
    for line in lines:
        _, ctrls, path = line.split(":", 2)
        for c in ctrls.split(","):
            if c in CONTROLLERS and c in v1:
                found[c] = v1[c] / path.lstrip("/")
    if not found and v2 is not None:
        for line in lines:
            if line.startswith("0::"):
                found = {c: v2 / line[3:].lstrip("/") for c in CONTROLLERS}
    return found


def set_cores(version: int, folders: dict[str, Path], cores: tuple[int, ...]) -> None:
    """Write the cpuset and CPU quota of exactly `cores` into a cgroup (v1 or v2)."""
    write(folders["cpuset"] / "cpuset.cpus", cpulist(cores))
    if version == 1:
        write(folders["cpu"] / "cpu.cfs_quota_us", str(len(cores) * PERIOD_US))
    else:
        write(folders["cpu"] / "cpu.max", f"{len(cores) * PERIOD_US} {PERIOD_US}")
