"""What a CPU node offers environments, read from this machine: memory, disk, the state folder."""

from __future__ import annotations

import os


def default_state_dir() -> str:
    """Where a node keeps its images, layers and snapshots: $TANGRAM_STATE_DIR, else
    /var/lib/tangram as root, else ~/.local/state/tangram."""
    if os.environ.get("TANGRAM_STATE_DIR"):
        return os.environ["TANGRAM_STATE_DIR"]
    if os.geteuid() == 0:
        return "/var/lib/tangram"
    return os.path.expanduser("~/.local/state/tangram")


def local_disk_mb(folder: str) -> int:
    """MiB free on the filesystem of `folder` (the node's disk capacity for environments)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize >> 20


def local_memory_mb() -> int:
    """This machine's memory (MiB), from /proc/meminfo (4096 where it says nothing)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 4096
