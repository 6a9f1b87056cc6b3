"""Files in and out of an environment's tree, confined to it by the kernel.

Every path is resolved with `openat2(2)` and `RESOLVE_IN_ROOT` against a descriptor of the
environment's root: `..` stops at the root and every symbolic link (absolute or relative, at
any depth) is resolved as if the root were `/`, so no path and no link planted by a command can
name a host file. `RESOLVE_NO_MAGICLINKS` refuses /proc-style links and `RESOLVE_NO_XDEV`
refuses crossing into another mount. Written files and the folders made for them belong to the
environment's uid (so its commands may change them).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Mapping, Sequence

from tangram.errors import BackendUnavailable, ValidationError

MAX_FILE = 64 << 20  # bytes of one file written or read
MAX_TOTAL = 256 << 20  # bytes of all the files of one call
MAX_PATH = 4096
SYS_OPENAT2 = 437  # the same number on x86_64 and aarch64 (the generic syscall table)
RESOLVE_NO_XDEV, RESOLVE_NO_MAGICLINKS, RESOLVE_IN_ROOT = 0x01, 0x02, 0x10
RESOLVE = RESOLVE_NO_XDEV | RESOLVE_NO_MAGICLINKS | RESOLVE_IN_ROOT
RETRIES = 1000  # tries of a resolution a concurrent rename or mount spoiled (EAGAIN)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = ctypes.CDLL(None, use_errno=True)


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = RESOLVE) -> int:
    """`openat2(dirfd, path, {flags, mode, resolve})`; raises OSError."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, resolve)
    name = os.fsencode(path)
    for _ in range(RETRIES):
        fd = _libc.syscall(SYS_OPENAT2, dirfd, name, ctypes.byref(how), ctypes.sizeof(how))
        # EAGAIN: a rename or mount anywhere on the host moved while a `..` was resolved, so
        # the kernel could not prove it stayed inside; openat2(2) says to try again.
        if fd >= 0 or ctypes.get_errno() != errno.EAGAIN:
            break
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise BackendUnavailable(
                "this kernel lacks openat2 (Linux >= 5.6): the files API "
                "needs it to keep paths inside the environment"
            )
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def check_paths(paths: Sequence[str], field: str) -> None:
    if isinstance(paths, str) or not isinstance(paths, Sequence | Mapping):
        raise ValidationError(field, paths, "must be a list of paths")
    for p in paths:
        if not isinstance(p, str) or not p.strip("/") or len(p) > MAX_PATH or "\x00" in p:
            raise ValidationError(
                field, p, f"must be a non-empty path of at most {MAX_PATH} characters without NUL"
            )


def write(root: str, files: Mapping[str, bytes], uid: int | None) -> None:
    """Write each of `files` (a path inside `root` -> its bytes), making missing folders."""
    check_paths(list(files), "files")
    total = 0
    for path, data in files.items():
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValidationError(f"files[{path}]", type(data).__name__, "must be bytes")
        if len(data) > MAX_FILE:
            raise ValidationError(f"files[{path}]", len(data), f"over {MAX_FILE} bytes")
        total += len(data)
    if total > MAX_TOTAL:
        raise ValidationError("files", total, f"over {MAX_TOTAL} bytes in one call")
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for path, data in files.items():
            _write_one(rootfd, path, bytes(data), uid)
    finally:
        os.close(rootfd)


def _write_one(rootfd: int, path: str, data: bytes, uid: int | None) -> None:
    parts = [p for p in path.split("/") if p not in ("", ".")]
    for i in range(1, len(parts)):  # each folder on the way, made where missing
        parent = "/".join(parts[: i - 1]) or "."
        pfd = _open(rootfd, parent, os.O_PATH | os.O_DIRECTORY, path)
        try:
            os.mkdir(parts[i - 1], 0o755, dir_fd=pfd)
            if uid is not None:
                os.chown(parts[i - 1], uid, uid, dir_fd=pfd, follow_symlinks=False)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ValidationError(
                "files", path, f"cannot make its folder ({exc.strerror})"
            ) from exc
        finally:
            os.close(pfd)
    # O_NONBLOCK: a FIFO a command left at the path must not hold the caller (the event loop,
    # for small writes) waiting for a reader; it is refused below, as any other non-file
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK
    fd = _open(rootfd, "/".join(parts), flags, path, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValidationError("files", path, "is not a regular file")
        if uid is not None:
            os.fchown(fd, uid, uid)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view) :]
            except OSError as exc:
                raise ValidationError("files", path, f"write failed ({exc.strerror})") from exc
    finally:
        os.close(fd)


def read(root: str, paths: Sequence[str], used: int = 0) -> dict[str, bytes | None]:
    """Each path's bytes (None when it is missing or not a regular file). `used`: bytes this
    call has read already (under other roots): the `MAX_TOTAL` bound is the whole call's."""
    check_paths(paths, "paths")
    out: dict[str, bytes | None] = {}
    total = used
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for path in paths:
            try:
                fd = _open(rootfd, path.lstrip("/") or ".", os.O_RDONLY | os.O_NONBLOCK, path)
            except ValidationError:
                out[path] = None
                continue
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    out[path] = None
                    continue
                if st.st_size > MAX_FILE:
                    raise ValidationError("paths", path, f"is {st.st_size} bytes, over {MAX_FILE}")
                chunks = []
                while chunk := os.read(fd, 1 << 20):
                    chunks.append(chunk)
                    total += len(chunk)
                    if total > MAX_TOTAL:
                        raise ValidationError(
                            "paths", path, f"over {MAX_TOTAL} bytes read in one call"
                        )
                out[path] = b"".join(chunks)
            finally:
                os.close(fd)
    finally:
        os.close(rootfd)
    return out


def _open(rootfd: int, rel: str, flags: int, path: str, mode: int = 0) -> int:
    try:
        return openat2(rootfd, rel, flags, mode)
    except BackendUnavailable:
        raise
    except OSError as exc:
        raise ValidationError("files", path, f"cannot open it ({exc.strerror})") from exc


def open_tree(root: str, rel: str) -> int:
    """An O_PATH descriptor of the folder `rel` inside `root` (resolved as every path here:
    never outside), for `tar -C /proc/self/fd/N`: tar then archives what lies below it without
    following links (they go into the archive as links)."""
    rootfd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return _open(rootfd, rel.strip("/") or ".", os.O_PATH | os.O_DIRECTORY, rel)
    finally:
        os.close(rootfd)
