"""Sandbox uids: one per environment, never reused while the host runs, never shared by servers.

The kernel keeps state per uid outside every namespace (keyrings, inotify and other per-user
limits, `/proc` ownership), so a uid that passes from a closed environment to a new one, or is
used by two servers at once, is a channel between them. Each server claims ranges of
`RANGE_SIZE` uids from a host-wide registry (`REGISTRY`, on /run: a tmpfs, so it lasts exactly
as long as the host runs) under an exclusive `flock`; claims are appended and never given back,
and a server hands out the uids of its ranges in order, each once. A server that uses up its
range claims the next.
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

from tangram.errors import BackendUnavailable

DEFAULT_UID_BASE = 2_000_000  # far above the host's users and the usual subuid ranges
REGISTRY = Path("/run/tangram/uid-ranges")  # lines "first count pid": every claim since boot
RANGE_SIZE = 65_536
MAX_UID = (1 << 32) - 2  # (uid_t)-1 is "no uid"


class UidAllocator:
    """Hands out uids >= `base` from ranges this server claimed in `registry`, each once."""

    def __init__(self, base: int, registry: Path = REGISTRY, size: int = RANGE_SIZE) -> None:
        self.base, self.registry, self.size = base, registry, size
        self._next = 0
        self._end = 0  # the current range is [_next, _end)
        self._lock = threading.Lock()
        self.claimed: list[tuple[int, int]] = []

    def take(self) -> int:
        """A uid no environment on this host has had since boot."""
        with self._lock:
            if self._next >= self._end:
                first = self._claim()
                self._next, self._end = first, first + self.size
                self.claimed.append((first, self.size))
            uid = self._next
            self._next += 1
            return uid

    def _claim(self) -> int:
        try:
            self.registry.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(self.registry, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise BackendUnavailable(
                f"cannot open the host's sandbox uid registry {self.registry} ({exc}): run as root"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            with os.fdopen(os.dup(fd), "r+") as f:
                end = self.base
                for line in f:
                    parts = line.split()
                    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
                        end = max(end, int(parts[0]) + int(parts[1]))
                if end + self.size > MAX_UID:
                    raise BackendUnavailable(
                        f"the host's sandbox uids are used up (registry "
                        f"{self.registry}); they come back at reboot"
                    )
                f.seek(0, os.SEEK_END)
                f.write(f"{end} {self.size} {os.getpid()}\n")
                f.flush()
                os.fsync(f.fileno())
            return end
        finally:
            os.close(fd)  # releases the lock
