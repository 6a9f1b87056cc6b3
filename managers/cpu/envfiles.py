"""The files API of the CPU manager's environments: write, read and tar their trees.

A mixin of `CpuManager` (its one job: paths into an environment's tree, see `roots` for what a
path means); it needs the manager's `envs` and `backend`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

from managers.cpu import files
from managers.cpu.backends.base import Backend
from managers.cpu.pool import Environment, EnvironmentTable
from managers.cpu.roots import Roots
from tangram.errors import ValidationError

INLINE_FILES, INLINE_BYTES = 8, 64 << 10  # written on the event loop (else in a thread)


class EnvFiles:
    envs: EnvironmentTable
    backend: Backend

    if TYPE_CHECKING:  # the manager's own

        def _require_started(self) -> None: ...

    def _tree(self, env_id: str) -> Environment:
        self._require_started()
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        if not self.backend.local:
            raise ValidationError(
                "env_id", env_id, f"the {self.backend.name} backend has no files API"
            )
        return env

    async def write_files(self, env_id: str, contents: Mapping[str, bytes]) -> None:
        """Write files into the environment (see `roots` for what a path means); missing
        folders are made; files and folders made belong to the environment's user."""
        env = self._tree(env_id)
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
                files.write(root, group, self.backend.owner(env))
            else:
                await asyncio.to_thread(files.write, root, group, self.backend.owner(env))

    async def tar_files(self, env_id: str, path: str) -> AsyncIterator[bytes]:
        """A tar stream of the folder `path` of the environment (links kept as links, never
        followed); for trees too large for `read_files`."""
        env = self._tree(env_id)
        root, rel = Roots.inside(env.root, env.workdir, path)
        fd = await asyncio.to_thread(files.open_tree, root, rel)
        try:
            proc = await asyncio.create_subprocess_exec(
                "tar",
                "-C",
                f"/proc/self/fd/{fd}",
                "-cf",
                "-",
                "--numeric-owner",
                ".",
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(fd,),
            )
        finally:
            os.close(fd)
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.read(1 << 16):
                yield chunk
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Each path's content, None where it is missing or not a regular file. At most
        `files.MAX_TOTAL` bytes in all, however the paths are spelled (`big`, `./big` and
        `/sandbox/big` count three times); read in one worker thread, off the event loop."""
        env = self._tree(env_id)
        files.check_paths(paths, "paths")
        return await asyncio.to_thread(_read_all, env, paths)


def _read_all(env: Environment, paths: Sequence[str]) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    used = 0  # one bound for the whole call, across every path and root
    for path in paths:
        root, rel = Roots.inside(env.root, env.workdir, path)
        data = files.read(root, [rel], used)[rel] if rel else None
        out[path] = data
        used += len(data or b"")
    return out
