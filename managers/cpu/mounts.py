"""Mounts the server makes on the host so that a sandbox's mount table names no host folder,
and the removal of a folder with mounts below it.

A mount record (`/proc/self/mountinfo`) shows its root as the path inside its filesystem, so a
bind of `/tmp/<folder>` shows `/tmp/<folder>` to whoever can read the table, a sandbox
included. A folder a sandbox sees is therefore a filesystem of its own (its root shows as `/`):
a tmpfs, or an overlay whose layers are named in its options as `/proc/self/fd/<n>` (a
descriptor held for the mount call only; the kernel shows the option strings as given), never
by their paths.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from collections.abc import Sequence
from pathlib import Path

from managers.cpu.removal import remove_tree

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_BIND = 0x1, 0x2, 0x4, 0x1000
MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_ESCAPED = re.compile(r"\\([0-7]{3})")  # mountinfo writes a space as \040


def mount(source: str, target: str | Path, fstype: str, flags: int, options: str = "") -> None:
    """mount(2); raises OSError naming `target`."""
    done = _libc.mount(
        source.encode(), os.fsencode(target), fstype.encode(), flags, options.encode() or None
    )
    if done != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting {fstype} at {target}: {os.strerror(err)}")


def overlay(
    target: str | Path,
    lowers: Sequence[str | Path],
    upper: str | Path | None = None,
    work: str | Path | None = None,
    flags: int = MS_NOSUID | MS_NODEV,
) -> None:
    """An overlay at `target` of `lowers` (top first; at least two without `upper`, the
    kernel's rule), writable into `upper` (with `work`, on its filesystem) when given; its
    options name each layer by a descriptor, never by its path."""
    fds: list[int] = []

    def named(p: str | Path) -> str:
        fds.append(os.open(p, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        return f"/proc/self/fd/{fds[-1]}"

    try:
        options = "lowerdir=" + ":".join(named(p) for p in lowers)
        if upper is not None:
            assert work is not None
            options += f",upperdir={named(upper)},workdir={named(work)},index=off"
        mount("overlay", target, "overlay", flags | (0 if upper else MS_RDONLY), options)
    finally:
        for fd in fds:
            os.close(fd)


def detach(target: str | Path) -> None:
    """Unmount `target` lazily (whoever still uses it keeps it until they let go); nothing
    when it is not a mount point."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):
            raise OSError(err, f"unmounting {target}: {os.strerror(err)}")


def mounts_below(folder: str | Path) -> list[str]:
    """Mount points at or below `folder` in this mount namespace, deepest first."""
    prefix = os.path.realpath(folder)
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                point = _ESCAPED.sub(lambda m: chr(int(m.group(1), 8)), line.split()[4])
                if point == prefix or point.startswith(prefix.rstrip("/") + "/"):
                    found.append(point)
    except OSError:
        return []
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def remove_folder(folder: str | Path) -> list[str]:
    """Unmount everything at or below `folder`, then remove it (`remove_tree`); returns what
    could not be removed."""
    left = []
    for point in mounts_below(folder):
        try:
            detach(point)
        except OSError as exc:
            left.append(str(exc))
    return left or remove_tree(folder)
