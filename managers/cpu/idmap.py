"""Idmapped layers: every environment, fork children and snapshot openings included, runs as a
uid of its own, and still owns the files it inherits.

On disk, in every writable and frozen layer, the files of an environment's user belong to one
uid of no one, `LAYER_OWNER`. Each layer of an environment's stack (its writable layer too) is
mounted for its overlay through an idmapped mount (Linux >= 5.19: `open_tree(OPEN_TREE_CLONE)`,
`mount_setattr(MOUNT_ATTR_IDMAP)` with a user namespace whose map sends `LAYER_OWNER` to the
environment's uid and every other id to itself; overlayfs keeps private clones of its layers, so
the attached clone is detached as soon as the overlay is up). So a file a parent wrote shows as
the child's inside the child and as the parent's inside the parent, a copy-up is stored as
`LAYER_OWNER` again, and no data is copied or walked: a fork's cost stays O(1) in what the
parent wrote (a user namespace, ~1 ms, and one clone per layer, ~0.1 ms).

Image files keep their own owners (root, the image's users: mapped to themselves). Where the
kernel refuses idmapped layers (`probe` says why), the manager falls back to what it did
before: a fork's children and a snapshot's environments run as the uid of the environment they
came from, sharing its per-uid kernel limits (the server logs that at start).
"""

from __future__ import annotations

import ctypes
import os
import struct
import subprocess
import time
from pathlib import Path

from managers.cpu.uids import MAX_UID

# the owner of the environment's user's files on disk: above every uid `uids` hands out
LAYER_OWNER = MAX_UID
_NO_ID = 1 << 32  # ids are < 2**32 - 1 ((uid_t)-1 is "no id")

# the mount API's system calls (the same numbers on every architecture since Linux 5.2/5.12)
_OPEN_TREE, _MOVE_MOUNT, _MOUNT_SETATTR = 428, 429, 442
_OPEN_TREE_CLONE, _AT_FDCWD, _AT_EMPTY_PATH = 1, -100, 0x1000
_MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_IDMAP, _MNT_DETACH = 0x4, 0x00100000, 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _call(what: str, number: int, *args) -> int:
    result = _libc.syscall(number, *args)
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def id_map(uid: int) -> str:
    """The uid_map (and gid_map) that sends `LAYER_OWNER` to `uid` and every other id to itself:
    identity ranges around the two ids, which neither side may cover twice."""
    if not 0 < uid < LAYER_OWNER:
        raise ValueError(f"uid {uid} cannot own a layer's files (0 < uid < {LAYER_OWNER})")
    low, high = sorted((uid, LAYER_OWNER))
    ranges = [(0, low), (low + 1, high - low - 1), (high + 1, _NO_ID - 1 - high - 1)]
    lines = [f"{first} {first} {count}" for first, count in ranges if count > 0]
    return "\n".join([*lines, f"{LAYER_OWNER} {uid} 1"]) + "\n"


def userns(uid: int) -> int:
    """A descriptor of a fresh user namespace mapped by `id_map(uid)` (a child that unshares
    one, whose maps the server writes as root; the child is gone once the descriptor is open)."""
    child = subprocess.Popen(["unshare", "--user", "--", "sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        ours = os.readlink("/proc/self/ns/user")
        deadline = time.monotonic() + 5
        while os.readlink(f"/proc/{child.pid}/ns/user") == ours:
            if child.poll() is not None or time.monotonic() > deadline:
                raise OSError(f"unshare --user did not make a user namespace (exit {child.poll()})")
            time.sleep(0.0002)
        text = id_map(uid)
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{child.pid}/{name}", "w") as f:
                f.write(text)
        return os.open(f"/proc/{child.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        child.kill()
        child.wait()


def attach(source: Path, target: Path, ns: int) -> None:
    """Mount a clone of the mount at `source`, idmapped through the user namespace `ns`, at
    `target` (an empty folder)."""
    fd = _call("open_tree", _OPEN_TREE, _AT_FDCWD, os.fsencode(source), _OPEN_TREE_CLONE)
    try:
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", _MOUNT_ATTR_IDMAP, 0, 0, ns))
        _call("mount_setattr", _MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, attr, len(attr.raw))
        _call(
            "move_mount",
            _MOVE_MOUNT,
            fd,
            b"",
            _AT_FDCWD,
            os.fsencode(target),
            _MOVE_MOUNT_F_EMPTY_PATH,
        )
    finally:
        os.close(fd)


def detach(target: Path) -> None:
    """Detach the mount at `target` (an attached clone the overlay no longer needs)."""
    if _libc.umount2(os.fsencode(target), _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"umount2 {target}: {os.strerror(err)}")
