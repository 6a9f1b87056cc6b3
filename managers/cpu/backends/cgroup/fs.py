"""The cgroup filesystem, v1 and v2: find it, and lay out Tangram's cgroups in it.

Layout (one `tangram-<server pid>-<tag>` folder per backend instance, under this process's own
cgroup in v1 and under the v2 root, or `TANGRAM_CGROUP_PARENT`, in v2):

    tangram-<pid>-<tag>/<env>/        the environment: memory and pids limits, CPU accounting
    tangram-<pid>-<tag>/<env>/x<i>/   an exec slot: cpuset and CPU quota of exactly the grant

v1 keeps a copy of this tree in each controller's hierarchy (cpu, cpuacct, cpuset; memory and
pids hold only the environment level); v2 has one tree with cpu, cpuset, memory (and pids)
enabled down to slots. The server's PID in the name lets a later server find the folders of a
dead one and sweep them (`sweep`). The pids controller is optional: without it there is no
per-environment process limit, and `Hierarchy.pids` says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from managers.cpu.leftovers import dead_owner, owned_name
from tangram.errors import BackendUnavailable

CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory")
V2_CONTROLLERS = ("cpu", "cpuset", "memory")
OPTIONAL = "pids"  # the process-count limit: used where mounted (v1) or available (v2)
PERIOD_US = 100_000
log = logging.getLogger(__name__)
FIX = "or choose backend='affinity' (no root, cpuset only) or 'docker'"


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where Tangram's tree lives: v1 one base per controller, v2 one base for all."""

    version: int
    bases: dict[str, Path]  # controller -> the tangram-<pid>-<tag> folder (pids: when present)

    @property
    def pids(self) -> bool:
        """Whether a per-environment process limit (the pids controller) is available."""
        return OPTIONAL in self.bases

    def base(self, controller: str) -> Path:
        return self.bases[controller]

    def distinct(self, controllers: tuple[str, ...] = (*CONTROLLERS, OPTIONAL)) -> list[Path]:
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
                    if opt in CONTROLLERS or opt == OPTIONAL:
                        v1.setdefault(opt, mountpoint)
    return v1, v2


FAVOR = "favordynmods"


def cgroup2_mount() -> tuple[str, list[str], list[str]] | None:
    """The first cgroup2 mount: (mount point, its mount options, its file system's options),
    from /proc/self/mountinfo; None where there is none."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rest = left.split(), right.split()
            if len(rest) >= 3 and rest[0] == "cgroup2":
                return fields[4], fields[5].split(","), rest[2].split(",")
    return None


def favor_dynmods(on: bool = True) -> str:
    """Set (or with `on` False clear) the kernel's `favordynmods` cgroup option, so moving a
    process between cgroups no longer waits for an RCU grace period (13.8 ms after 50 ms idle
    on the development machine, 0.26 ms with it): each exec moves its command into its slot.
    The option is the cgroup2 mount's, and it switches the one lock every hierarchy shares, so
    it applies to v1 controllers as well; its price is a slightly slower fork and exit
    host-wide (the kernel's cgroup-v2 documentation). The mount is remounted with every
    other option it had. Returns what was done, for the log."""
    found = cgroup2_mount()
    if found is None:
        return "no cgroup2 mount: cgroup moves wait for the kernel's RCU grace period"
    where, mount_opts, super_opts = found
    if (FAVOR in super_opts) == on:
        return f"{FAVOR} already {'set' if on else 'clear'} on {where}"
    opts = dict.fromkeys([*mount_opts, *super_opts, *([FAVOR] if on else [])])
    opts.pop("rw", None)
    opts.pop(FAVOR if not on else "", None)
    cmd = ["mount", "-t", "cgroup2", "-o", ",".join(["remount", *opts]), "cgroup2", where]
    verb = "set" if on else "clear"
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not {verb} {FAVOR} on {where} ({exc})"
    if done.returncode != 0:
        return f"could not {verb} {FAVOR} on {where} ({done.stderr.strip() or done.returncode})"
    return f"{verb} {FAVOR} on {where}"


def _own_paths() -> dict[str, str]:
    own: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            for c in ctrls.split(",") if ctrls else ["unified"]:
                own[c] = path
    return own


def version() -> int | None:
    """The cgroup version Tangram uses here, the one rule every backend follows: 2 where the
    unified hierarchy has the cpu, cpuset and memory controllers and v1 holds none of them, 1
    where v1 holds any of them, None where neither (or the mounts cannot be read)."""
    try:
        v1, v2 = _mounts()
    except OSError:
        return None
    return _version(v1, v2)


def _version(v1: dict[str, Path], v2: Path | None) -> int | None:
    if (
        v2 is not None
        and set(V2_CONTROLLERS) <= _v2_available(v2)
        and not (set(V2_CONTROLLERS) & set(v1))
    ):
        return 2
    return 1 if v1 else None


def _v2_available(v2: Path) -> set[str]:
    try:
        return set((v2 / "cgroup.controllers").read_text().split())
    except OSError:
        return set()


def detect(tag: str, parent: str | None = None) -> Hierarchy:
    """The hierarchy to use (`version`); raises `BackendUnavailable` with the fix when there is
    none usable. Reads only: nothing is created until the backend makes its bases."""
    try:
        v1, v2 = _mounts()
        own = _own_paths()
    except OSError as exc:
        raise BackendUnavailable(
            f"cannot read the cgroup mounts ({exc}): mount /sys/fs/cgroup and /proc, {FIX}"
        ) from exc
    parent = parent or os.environ.get("TANGRAM_CGROUP_PARENT") or None
    if os.geteuid() != 0:
        return delegated(tag, parent, v1, v2, own)
    if _version(v1, v2) == 2:
        assert v2 is not None
        root = Path(parent) if parent else v2
        names = [*CONTROLLERS, *([OPTIONAL] if OPTIONAL in _v2_available(v2) else [])]
        return Hierarchy(2, {c: root / base_name(tag) for c in names})
    missing = [c for c in CONTROLLERS if c not in v1]
    if missing:
        raise BackendUnavailable(
            f"no usable cgroup hierarchy: cgroup v2 lacks the cpu/cpuset/memory controllers and "
            f"cgroup v1 lacks {', '.join(missing)}: mount them (e.g. `mount -t cgroup -o "
            f"{','.join(missing)} cgroup /sys/fs/cgroup/{missing[0]}`), {FIX}"
        )
    bases = {}
    for c in [*CONTROLLERS, *([OPTIONAL] if OPTIONAL in v1 else [])]:
        below = Path(parent) if parent else v1[c] / own.get(c, "/").lstrip("/")
        bases[c] = below / base_name(tag)
    return Hierarchy(1, bases)


def delegated(
    tag: str, parent: str | None, v1: dict[str, Path], v2: Path | None, own: dict[str, str]
) -> Hierarchy:
    """Without root: the cgroup subtree delegated to this user (`delegation`), with Tangram's
    tree in it; raises `BackendUnavailable` saying where it looked and why each place failed."""
    found, why = delegation(parent, v1, v2, own)
    if found is None:
        raise BackendUnavailable(
            f"the cgroup backend needs root or a cgroup subtree delegated to this user (uid "
            f"{os.geteuid()}), and none is: {why}; without one there is no per-exec cpuset "
            f"and quota and no memory or pids limit (an administrator delegates one: "
            f"docs/rootless.md), {FIX}"
        )
    return Hierarchy(found.version, {c: p / base_name(tag) for c, p in found.bases.items()})


def delegation(
    parent: str | None, v1: dict[str, Path], v2: Path | None, own: dict[str, str]
) -> tuple[Hierarchy | None, str]:
    """The writable cgroup folders this user may build under, per controller (the bases of
    the returned `Hierarchy` are those folders themselves), or None and why not. v2: `parent`,
    else this process's own cgroup (systemd's `Delegate=yes`); v1, per controller: `parent`
    below the controller's mount, this process's own cgroup there (a batch system's job
    cgroup), `tangram-user-<name>` (`.ci/rootless.sh`)."""
    if _version(v1, v2) == 2:
        assert v2 is not None
        mine = v2 / own.get("unified", "/").lstrip("/")
        tries = [Path(parent)] if parent else [mine, v2 / user_folder()]
        ok = [p for p in tries if os.access(p, os.W_OK) and os.access(p / "cgroup.procs", os.W_OK)]
        if not ok:
            return None, f"cgroup v2: none of {', '.join(map(str, tries))} is writable by this user"
        names = [*CONTROLLERS, *([OPTIONAL] if OPTIONAL in _v2_available(v2) else [])]
        return Hierarchy(2, {c: ok[0] for c in names}), f"cgroup v2: {ok[0]}"
    bases: dict[str, Path] = {}
    tried: list[str] = []
    for c in [*CONTROLLERS, *([OPTIONAL] if OPTIONAL in v1 else [])]:
        if c not in v1:
            tried.append(f"{c}: not mounted")
            continue
        candidates = [v1[c] / own.get(c, "/").lstrip("/"), v1[c] / user_folder()]
        if parent:
            candidates.insert(0, v1[c] / parent.lstrip("/"))
        ok = [p for p in candidates if os.access(p, os.W_OK | os.X_OK)]
        if ok:
            bases[c] = ok[0]
        else:
            tried.append(f"{c}: none of {', '.join(map(str, candidates))} is writable")
    missing = [c for c in CONTROLLERS if c not in bases]
    if missing:
        return None, "cgroup v1: " + "; ".join(tried)
    return Hierarchy(1, bases), "cgroup v1: " + ", ".join(f"{c} {p}" for c, p in bases.items())


def user_folder() -> str:
    """The v1 folder an administrator delegates to a user (`.ci/rootless.sh`)."""
    try:
        name = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        name = str(os.geteuid())
    return f"tangram-user-{name}"


def base_name(tag: str) -> str:
    """`tangram-<this server's pid>-<tag>`: a later server sweeps it once this PID is gone."""
    return owned_name(tag)


def remove_tree(top: Path) -> None:
    """Kill every process in a cgroup folder and below, and remove the folders, deepest first."""
    subs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for f in [*subs, top]:
        remove_killing(f)


def remove_killing(folder: Path) -> None:
    """Kill what is left in a cgroup folder and remove it (waiting for the dying to leave)."""
    for attempt in range(200):
        kill_all(folder)
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # EBUSY while killed processes are still exiting
            time.sleep(0.005 * min(attempt + 1, 10))
    log.warning("could not remove cgroup %s: processes remain", folder)


def sweep(h: Hierarchy) -> list[str]:
    """Remove the cgroup trees of dead servers beside ours (killing what still runs in them);
    returns what was swept, as `folder (server pid P, N processes)`."""
    swept = []
    for parent in dict.fromkeys(b.parent for b in h.bases.values()):
        try:
            found = [p for p in parent.iterdir() if p.is_dir() and dead_owner(p.name)]
        except OSError:
            continue
        for top in found:
            n = sum(len(pids(p)) for p in [top, *top.rglob("*")] if p.is_dir())
            remove_tree(top)
            swept.append(f"{top} (server pid {dead_owner(top.name)}, {n} processes)")
    return swept


def oom_kills(version: int, memory_folder: Path) -> int:
    """How many processes the kernel killed for memory in this cgroup (and below) so far."""
    name = "memory.oom_control" if version == 1 else "memory.events"
    return _counter(memory_folder / name, "oom_kill")


def pids_refused(pids_folder: Path | None) -> int:
    """How often the cgroup's pids limit refused a fork so far (0 without a pids folder)."""
    return 0 if pids_folder is None else _counter(pids_folder / "pids.events", "max")


def _counter(path: Path, key: str) -> int:
    try:
        for line in read(path).splitlines():
            k, _, v = line.partition(" ")
            if k == key:
                return int(v)
    except (OSError, ValueError):
        pass
    return 0


def write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read(path: Path) -> str:
    """A cgroup file's text, stripped (raw reads: a text-mode `open` costs ~3x the read, and
    a reset or an exec's end reads several)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = chunk = os.read(fd, 65536)
        while chunk:  # a long cgroup.procs
            chunk = os.read(fd, 65536)
            data += chunk
    finally:
        os.close(fd)
    return data.decode().strip()


def pids(folder: Path) -> list[int]:
    try:
        return [int(p) for p in read(folder / "cgroup.procs").split()]
    except OSError:  # gone, or being removed (ENODEV) while we read it
        return []


def alone(pids_folder: Path | None, own: frozenset[int]) -> bool:
    """Whether the cgroup of `pids_folder` (its pids controller's) holds no task but the
    processes `own`, each alive: its task count (`pids.current`, one counter, a fraction of
    the cost of listing `cgroup.procs` in v1) equals theirs. A leftover anywhere below adds
    to the count (its threads too); False when it cannot tell (no pids controller)."""
    if pids_folder is None or not own:
        return False
    try:
        if int(read(pids_folder / "pids.current")) != len(own):
            return False
        for pid in own:  # one of them gone, a leftover in its place: the same count
            os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


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


def folders_of(pid: int) -> tuple[int, dict[str, Path]] | None:
    """The cgroup version (`version`) and the folder holding `pid` per controller (cpu,
    cpuacct, cpuset, memory, and pids where there is one; the one v2 folder under every
    name). None when /proc or the mounts cannot be read."""
    try:
        v1, v2 = _mounts()
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    v = _version(v1, v2)
    found: dict[str, Path] = {}
    if v == 1:
        for line in lines:
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(","):
                if c in (*CONTROLLERS, OPTIONAL) and c in v1:
                    found[c] = v1[c] / path.lstrip("/")
    elif v == 2 and v2 is not None:
        for line in lines:
            if line.startswith("0::"):
                found = {c: v2 / line[3:].lstrip("/") for c in (*CONTROLLERS, OPTIONAL)}
    if v is None or not set(CONTROLLERS) <= set(found):
        return None
    return v, found


def set_cores(
    version: int,
    folders: dict[str, Path],
    cores: tuple[int, ...],
    now: tuple[str, str] = ("", ""),
    share: float | None = None,
) -> tuple[str, str]:
    """Write the cpuset and CPU quota of exactly `cores` into a cgroup (v1 or v2), each skipped
    when `now` (what the last call returned) already holds it; returns what the cgroup holds.
    `share`: a quota of that many cores instead (a fraction of one: a background allowance)."""
    cpus = cpulist(cores)
    us = len(cores) * PERIOD_US if share is None else max(1000, round(share * PERIOD_US))
    if version == 1:
        name, quota = "cpu.cfs_quota_us", str(us)
    else:
        name, quota = "cpu.max", f"{us} {PERIOD_US}"
    if cpus != now[0]:
        write(folders["cpuset"] / "cpuset.cpus", cpus)
    if quota != now[1]:
        write(folders["cpu"] / name, quota)
    return cpus, quota
