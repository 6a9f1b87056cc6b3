"""How the server names a sandbox's holder without holding its namespaces open.

An environment used to cost six open descriptors in the server (one per namespace), so a
server under the usual 1,024 open-file limit held 168 environments at most. Now it keeps the
holder's PID and its start time (field 22 of /proc/PID/stat, in clock ticks since boot) and
holds nothing: each exec opens `/proc/PID` as a directory, checks the start time through that
descriptor and passes it to `nsenter` as `/proc/self/fd/N/ns/<namespace>`. A directory
descriptor of /proc/PID names that process only (a recycled PID is another process, whose
files the old descriptor never reaches), so a recycled PID still cannot redirect an exec.
"""

from __future__ import annotations

import contextlib
import os

from managers.cpu.backends.limits import raise_if_out_of_files

NSENTER_FLAG = {
    "user": "--user",
    "mnt": "--mount",
    "pid": "--pid",
    "net": "--net",
    "ipc": "--ipc",
    "uts": "--uts",
    "cgroup": "--cgroup",
}


def start_time(pid: int, dirfd: int | None = None) -> int | None:
    """The start time of `pid` (or of the process `dirfd` names), None when it is gone."""
    try:
        if dirfd is None:
            with open(f"/proc/{pid}/stat", "rb") as f:
                raw = f.read()
        else:
            fd = os.open("stat", os.O_RDONLY, dir_fd=dirfd)
            try:
                raw = os.read(fd, 4096)
            finally:
                os.close(fd)
    except (FileNotFoundError, ProcessLookupError):
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return int(raw[raw.rindex(b")") + 2 :].split()[19])


def open_holder(pid: int, started: int) -> int | None:
    """A directory descriptor of /proc/`pid` when that process is still the one started at
    `started`, else None. Raises `LimitReached` when the server is out of descriptors."""
    try:
        dirfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise_if_out_of_files(exc)
        raise
    if start_time(pid, dirfd) != started:
        os.close(dirfd)
        return None
    return dirfd


def nsenter_args(dirfd: int, namespaces: tuple[str, ...]) -> list[str]:
    return [f"{NSENTER_FLAG[ns]}=/proc/self/fd/{dirfd}/ns/{ns}" for ns in namespaces]


def args_fd(args: list[str]) -> int:
    """A memory file holding `args` NUL-separated, at offset 0: for `bwrap --args FD`, so the
    sandbox's init shows only `bwrap --args FD` in /proc/1/cmdline (not the host's paths)."""
    fd = os.memfd_create("bwrap-args", 0)
    try:
        os.write(fd, b"".join(a.encode() + b"\0" for a in args))
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def data_fd(data: bytes) -> int:
    """A memory file holding `data` at offset 0 (bwrap's `--seccomp FD`)."""
    fd = os.memfd_create("bwrap-data", 0)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
