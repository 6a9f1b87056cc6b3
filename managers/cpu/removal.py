"""Removing a tree a sandboxed command built: it must not fail, recurse, follow links or block.

A command owns its work folder and may leave anything there: a directory chain thousands of
levels deep (deeper than PATH_MAX and than Python's recursion limit, where `shutil.rmtree`
raised RecursionError), hundreds of thousands of files, symbolic links to the host's files,
folders without write or search permission, immutable or append-only entries. `remove_tree`
walks it without recursion and without paths: one open directory at a time, descending with
`openat(O_NOFOLLOW)` and climbing back through `..`, checked against the device and inode it
came from. Links are unlinked, never followed; permissions and immutable flags are cleared
where they stop a removal. It returns what it could not remove (never raises for the tree's
contents), so a close can release everything else and say what is left.

It blocks for as long as the tree takes: callers on the event loop run it in a thread
(`remove_tree_async`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import stat
import struct
from pathlib import Path

FS_IOC_GETFLAGS = 0x80086601
FS_IOC_SETFLAGS = 0x40086602
FS_IMMUTABLE_FL = 0x00000010
FS_APPEND_FL = 0x00000020
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_PROBLEMS = 20  # named in the report; the rest counted


def _clear_flags(name: str, dir_fd: int) -> None:
    """Clear the immutable and append-only flags of `name` (needs CAP_LINUX_IMMUTABLE)."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return
    try:
        flags = struct.unpack("l", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 8))[0]
        if flags & (FS_IMMUTABLE_FL | FS_APPEND_FL):
            fcntl.ioctl(
                fd, FS_IOC_SETFLAGS, struct.pack("l", flags & ~(FS_IMMUTABLE_FL | FS_APPEND_FL))
            )
    except OSError:
        pass
    finally:
        os.close(fd)


def _unblock(dir_fd: int, name: str | None) -> None:
    """Make the folder `dir_fd` writable and searchable, clear its flags and those of `name`."""
    with contextlib.suppress(OSError):
        os.chmod(dir_fd, 0o700)
    _clear_flags(".", dir_fd)
    if name is not None:
        _clear_flags(name, dir_fd)


def _retrying(op, name: str, dir_fd: int) -> None:
    try:
        op(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    except PermissionError:
        _unblock(dir_fd, name)
        try:
            op(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return


def _open_dir(name: str, dir_fd: int) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except PermissionError:
        with contextlib.suppress(OSError):
            os.chmod(name, 0o700, dir_fd=dir_fd)  # a directory (lstat said so): no link
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


def remove_tree(path: str | Path) -> list[str]:
    """Remove `path` and everything under it; returns what could not be removed (empty when
    all of it went). A missing path is not a problem; a link at `path` is removed, not followed."""
    path = str(path)
    problems: list[str] = []
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return problems
    except OSError as exc:
        return [f"{path}: {exc.strerror}"]
    if not stat.S_ISDIR(st.st_mode):
        try:
            parent = os.open(os.path.dirname(path) or ".", _DIR_FLAGS)
        except OSError as exc:
            return [f"{path}: {exc.strerror}"]
        try:
            _retrying(os.unlink, os.path.basename(path), parent)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
        finally:
            os.close(parent)
        return problems
    try:
        fd = os.open(path, _DIR_FLAGS)
        _walk(path, fd, problems)
    except OSError as exc:  # out of descriptors, a folder gone mid-walk: say so, never raise
        return [*problems, f"{path}: {exc.strerror or exc}"]
    try:
        parent = os.open(os.path.dirname(path.rstrip("/")) or "/", _DIR_FLAGS)
    except OSError as exc:
        return [*problems, f"{path}: {exc.strerror}"]
    try:
        _retrying(os.rmdir, os.path.basename(path.rstrip("/")), parent)
    except OSError as exc:
        problems.append(f"{path}: {exc.strerror}")
    finally:
        os.close(parent)
    if len(problems) > MAX_PROBLEMS:
        problems = [*problems[:MAX_PROBLEMS], f"and {len(problems) - MAX_PROBLEMS} more"]
    return problems


def _walk(top: str, fd: int, problems: list[str]) -> None:
    """Empty the folder open at `fd` (closed on return), depth first, one descriptor open."""
    names: list[str] = []  # the path from `top` to the current folder
    ids = [_ident(fd)]  # (device, inode) of each folder on that path
    skip: set[tuple[int, int]] = set()  # folders that could not be emptied
    try:
        while True:
            child = _empty_files(fd, skip, names, top, problems)
            if child is not None:
                try:
                    sub = _open_dir(child, fd)
                except OSError as exc:
                    problems.append(f"{_at(top, names, child)}: {exc.strerror}")
                    try:
                        skip.add(_lident(child, fd))
                    except OSError:
                        pass  # gone meanwhile: the next scan will not see it
                    continue
                os.close(fd)
                fd = sub
                names.append(child)
                ids.append(_ident(fd))
                continue
            if not names:
                return
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            if _ident(up) != ids[-2]:  # moved under us: stop rather than remove elsewhere
                os.close(up)
                problems.append(f"{_at(top, names, '')}: moved while being removed")
                return
            os.close(fd)
            fd = up
            name = names.pop()
            gone = ids.pop()
            try:
                _retrying(os.rmdir, name, fd)
            except OSError as exc:
                if gone not in skip:
                    problems.append(f"{_at(top, names, name)}: {exc.strerror}")
                skip.add(gone)
    finally:
        os.close(fd)


def _empty_files(
    fd: int, skip: set[tuple[int, int]], names: list[str], top: str, problems: list[str]
) -> str | None:
    """Unlink every non-folder in the folder `fd`; returns the first sub-folder to descend
    into (one not in `skip`), or None when none is left."""
    try:
        entries = os.scandir(fd)
    except PermissionError:
        _unblock(fd, None)
        entries = os.scandir(fd)
    dev = os.fstat(fd).st_dev
    with entries:
        for entry in entries:
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False
            if is_dir:
                if (dev, entry.inode()) not in skip:
                    return entry.name
                continue
            try:
                _retrying(os.unlink, entry.name, fd)
            except OSError as exc:
                problems.append(f"{_at(top, names, entry.name)}: {exc.strerror}")
    return None


def _ident(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _lident(name: str, dir_fd: int) -> tuple[int, int]:
    st = os.lstat(name, dir_fd=dir_fd)
    return st.st_dev, st.st_ino


def _at(top: str, names: list[str], leaf: str) -> str:
    inner = "/".join(names) if len(names) <= 8 else f".../{'/'.join(names[-4:])}"
    return os.path.join(top, inner, leaf) if inner else os.path.join(top, leaf)


async def remove_tree_async(path: str | Path) -> list[str]:
    """`remove_tree` in a worker thread, so the event loop keeps serving other clients."""
    return await asyncio.to_thread(remove_tree, path)
