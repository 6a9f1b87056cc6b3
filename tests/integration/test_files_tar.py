"""`tar_files` (and `GET /v1/envs/{id}/files/tar`): bounded, sparse-aware, and run inside the
environment as its own user, not as root on the host.

Real components: a real bwrap sandbox (root) with disk-bounded layers, GNU tar, the HTTP app in
process. Each test fails on the tar that ran as root on the host without a bound: a 2 TiB
sparse file streamed its zeros, a root-only file went into the archive, nothing was refused."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
import tempfile
from pathlib import Path

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.layers import LayerStore, unmount_below
from managers.cpu.request import ExecRequest
from tangram.errors import ValidationError
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app


def _reason() -> str | None:
    why = BwrapBackend.probe()
    if why is not None:
        return why
    with tempfile.TemporaryDirectory() as d:
        return LayerStore(d).why_not


REASON = _reason()
pytestmark = pytest.mark.skipif(
    REASON is not None, reason=f"needs root, bwrap, overlayfs and loop devices: {REASON}"
)
TWO_TIB = 2 << 40


@pytest.fixture
def state(tmp_path: Path):
    os.chmod(tmp_path, 0o755)
    yield tmp_path
    unmount_below(tmp_path)


async def _tar(m: CpuManager, env: str, path: str, most: int = 64 << 20) -> bytes:
    """The stream, read until `most` bytes (a stream of 2 TiB of zeros fails, not fills RAM)."""
    got = bytearray()
    stream = m.tar_files(env, path)
    try:
        async for chunk in stream:
            got += chunk
            if len(got) > most:
                break
    finally:
        await stream.aclose()
    return bytes(got)


async def _sh(m: CpuManager, env: str, command: str):
    result = await m.execute(ExecRequest(env, command, timeout=60))
    assert result.exit_code == 0, result
    return result


def test_a_sparse_file_of_2_tib_crosses_as_its_holes(state: Path) -> None:
    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            env = await m.open_env("sparse", 64, disk_mb=64)
            await _sh(m, env, "truncate -s 2T big && printf data > small")
            data = await _tar(m, env, "/sandbox")
            assert len(data) < 1 << 20  # headers and a sparse map, not 2 TiB of zeros
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                assert tar.getmember("./big").size == TWO_TIB
                assert tar.extractfile("./small").read() == b"data"
        finally:
            await m.close()

    asyncio.run(go())


def test_tar_runs_as_the_environments_user_inside_its_sandbox(state: Path) -> None:
    """A root-only file in the work folder (the host's root made it) is not the environment's
    to read, so it is not in the archive; what the environment owns is, with its uid."""

    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            env = await m.open_env("as-uid", 64)
            await m.write_files(env, {"mine.txt": b"mine"})
            workdir = m.envs.get(env).workdir
            secret = Path(workdir) / "root-only"
            secret.write_bytes(b"host-root-secret")
            os.chown(secret, 0, 0)
            secret.chmod(0o600)
            data = await _tar(m, env, "/sandbox")
            assert b"host-root-secret" not in data
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                mine = tar.getmember("./mine.txt")
                assert mine.uid == m.sandbox(env).uid
                assert tar.extractfile(mine).read() == b"mine"
        finally:
            await m.close()

    asyncio.run(go())


def test_an_archive_over_the_bound_is_refused_naming_it(state: Path) -> None:
    async def go():
        m = CpuManager("bwrap", state_dir=str(state), tar_max_mb=1)
        await m.start()
        try:
            env = await m.open_env("bound", 64, disk_mb=64)
            await _sh(m, env, "head -c 3000000 /dev/urandom > noise")
            with pytest.raises(ValidationError, match="cpu.tar_max_mb") as bad:
                await _tar(m, env, "/sandbox")
            assert bad.value.field == "path" and "1 MiB" in bad.value.problem
            await _sh(m, env, "rm noise && head -c 100000 /dev/urandom > fits")
            assert len(await _tar(m, env, "/sandbox")) > 100000
        finally:
            await m.close()

    asyncio.run(go())


def test_over_http_the_refusal_is_a_4xx_before_any_byte(state: Path) -> None:
    async def go():
        tg = Tangram(cpu=CpuManager("bwrap", state_dir=str(state), tar_max_mb=1))
        async with tg:
            env = await tg.open_env("http", memory_mb=64)
            await tg.write_files(env, {"noise": os.urandom(2 << 20), "a/b": b"b"})
            transport = httpx.ASGITransport(app=create_app(tg))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
                url = f"/v1/envs/{env}/files/tar"
                over = await h.get(url, params={"path": "/sandbox"})
                assert over.status_code == 422, over.text
                assert "cpu.tar_max_mb" in over.text and "Traceback" not in over.text
                ok = await h.get(url, params={"path": "/sandbox/a"})
                assert ok.status_code == 200
                with tarfile.open(fileobj=io.BytesIO(ok.content)) as tar:
                    assert tar.extractfile("./b").read() == b"b"

    asyncio.run(go())


def test_config_refuses_a_bad_bound() -> None:
    for bad in (0, -1, True, 1.5, "1"):
        with pytest.raises(ValidationError, match="cpu.tar_max_mb"):
            CpuManager("affinity", tar_max_mb=bad)
