"""The files API of the CPU manager's environments: write, read and tar their trees.

A mixin of `CpuManager` (its one job: paths into an environment's tree, see `roots` for what a
path means); it needs the manager's `envs` and `backend`.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

from managers.cpu import files
from managers.cpu.backends.base import Backend, Sandbox
from managers.cpu.environments import Environment, EnvironmentTable, EnvRecord
from managers.cpu.roots import Roots
from managers.cpu.subids import PassFd
from tangram.errors import ValidationError

INLINE_FILES, INLINE_BYTES = 8, 64 << 10  # written on the event loop (else in a thread)
TAR_MAX_MB = 1024  # the default bound of one tar stream
# GNU tar in the folder given as descriptor 0 (the resolved folder: never a path to re-resolve),
# holes found with SEEK_HOLE and kept as holes, one file system (no /proc, /dev below `/`)
TAR = ["tar", "-C", "/proc/self/fd/0", "--sparse", "--one-file-system", "--numeric-owner", "-c"]


def check_tar_max_mb(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValidationError("cpu.tar_max_mb", value, "must be a positive integer (MiB)")
    return value


class EnvFiles:
    envs: EnvironmentTable
    backend: Backend
    tar_max: int  # bytes of one tar stream

    if TYPE_CHECKING:  # the manager's own

        def _require_started(self) -> None: ...

    def _tree(self, env_id: str) -> EnvRecord:
        self._require_started()
        record = self.envs.record(env_id) if isinstance(env_id, str) else None
        if record is None or record.sandbox is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        if not self.backend.local:
            raise ValidationError(
                "env_id", env_id, f"the {self.backend.name} backend has no files API"
            )
        return record

    async def write_files(self, env_id: str, contents: Mapping[str, bytes]) -> None:
        """Write files into the environment (see `roots` for what a path means); missing
        folders are made; files and folders made belong to the environment's user."""
        record = self._tree(env_id)
        env, uid, sandbox = record.env, record.sandbox.uid, record.sandbox
        if not isinstance(contents, Mapping):
            raise ValidationError("files", type(contents).__name__, "must map paths to bytes")
        by_root: dict[str, dict[str, bytes]] = {}
        for path, data in contents.items():
            root, rel = Roots.inside(env.root, env.workdir, path)
            by_root.setdefault(root, {})[rel] = data
        sizes = [
            len(v) if isinstance(v, bytes | bytearray) else INLINE_BYTES for v in contents.values()
        ]
        small = len(sizes) <= INLINE_FILES and sum(sizes) < INLINE_BYTES
        for root, group in by_root.items():
            if small:  # a few small files (a program and its stdin): a thread hop costs more
                sandbox.owner_call(files.write, root, group, uid)
            else:
                await asyncio.to_thread(sandbox.owner_call, files.write, root, group, uid)

    async def tar_files(self, env_id: str, path: str) -> AsyncIterator[bytes]:
        """A tar stream of the folder `path` of the environment (links kept as links, never
        followed; holes of sparse files kept as holes, not zeros on the wire). The folder is
        resolved as every files-API path (`files.open_tree`: never outside); `tar` then runs
        as one of the environment's commands would (`Sandbox.serving`: its cgroup, its sandbox
        and uid, its seccomp filter), reading the folder through that descriptor, so it reads
        only what the environment's own user may. Refused naming `tar_max_mb` when the
        archive would be larger than the bound (measured first by the same tar, writing to
        /dev/null, which reads no data); one that grows past it while streaming is cut there,
        and the stream ends with an error."""
        record = self._tree(env_id)
        env, sandbox = record.env, record.sandbox
        root, rel = Roots.inside(env.root, env.workdir, path)
        fd = await asyncio.to_thread(sandbox.owner_call, _open_tree, root, rel)
        try:
            size = await self._tar_size(sandbox, fd, path)
            if size > self.tar_max:
                raise ValidationError(
                    "path",
                    path,
                    f"its tar would be {size} bytes, over the bound of one call "
                    f"({self.tar_max >> 20} MiB, cpu.tar_max_mb)",
                )
            async with sandbox.serving([*TAR, "-f", "-", "."], fd, self.tar_max) as p:
                assert p.stdout is not None
                sent = 0
                while chunk := await p.stdout.read(1 << 16):
                    sent += len(chunk)
                    if sent > self.tar_max:
                        raise ValidationError(
                            "path",
                            path,
                            f"its tar grew past the bound of one call while it was read "
                            f"({self.tar_max >> 20} MiB, cpu.tar_max_mb): cut there",
                        )
                    yield chunk
                await p.wait()
        finally:
            os.close(fd)

    @staticmethod
    async def _tar_size(sandbox: Sandbox, fd: int, path: str) -> int:
        """The size of the folder's archive (GNU tar's `--totals` of an archive written to
        /dev/null, which stats every file and reads none)."""
        argv = [*TAR, "-f", "/dev/null", "--totals", "."]
        async with sandbox.serving(argv, fd, 1 << 16) as proc:
            _, err = await proc.communicate()
        found = re.search(rb"Total bytes written: (\d+)", err)
        if found is None:
            why = err.decode(errors="replace").strip().splitlines()
            raise ValidationError(
                "path", path, f"cannot archive it ({why[-1] if why else 'tar failed'})"
            )
        return int(found.group(1))

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Each path's content, None where it is missing or not a regular file. At most
        `files.MAX_TOTAL` bytes in all, however the paths are spelled (`big`, `./big` and
        `/sandbox/big` count three times); read in one worker thread, off the event loop."""
        record = self._tree(env_id)
        files.check_paths(paths, "paths")
        return await asyncio.to_thread(record.sandbox.owner_call, _read_all, record.env, paths)


def _open_tree(root: str, rel: str) -> PassFd:
    return PassFd(files.open_tree(root, rel))  # (sent back where it runs in a child)


def _read_all(env: Environment, paths: Sequence[str]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    used = 0  # one bound for the whole call, across every path and root
    for path in paths:
        root, rel = Roots.inside(env.root, env.workdir, path)
        data = files.read(root, [rel], used)[rel] if rel else None
        out[path] = data
        used += len(data or b"")
    return out
