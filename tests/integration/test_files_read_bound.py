"""`read_files` (and `POST /v1/envs/{id}/files/read`): one bound of `files.MAX_TOTAL` bytes for
the whole call, however its paths are spelled (issue 36: the bound restarted for each path, so
8 spellings of one 64 MiB file returned 512 MiB), read and encoded off the event loop.

Real components: the CPU manager on the `affinity` backend (no root needed), its work folder
on this machine's disk (sparse files: no space used), the HTTP app in process."""

from __future__ import annotations

import asyncio
import base64
import os
import threading

import httpx
import pytest

from managers.cpu import CpuManager, files
from managers.cpu.backends.affinity import AffinityBackend
from tangram.errors import ValidationError
from tangram.runtime.facade import Tangram
from tangram.runtime.http import env_routes
from tangram.runtime.server import create_app

SPELLINGS = ["big", "./big", "/sandbox/big", ".//big", "/sandbox/./big", "sub/../big"]


def _big(workdir: str, size: int = files.MAX_FILE) -> None:
    os.makedirs(os.path.join(workdir, "sub"), exist_ok=True)
    with open(os.path.join(workdir, "big"), "wb") as f:
        f.truncate(size)  # sparse: reads as zeros, takes no disk


def test_the_bound_is_the_whole_calls_across_spellings_of_one_file(tmp_path):
    async def main():
        m = CpuManager(AffinityBackend(), workdir_root=str(tmp_path))
        await m.start()
        try:
            env = await m.open_env("t", 64)
            _big(m.envs.get(env).workdir)
            per = files.MAX_TOTAL // files.MAX_FILE  # 4 spellings fit exactly
            got = await m.read_files(env, SPELLINGS[:per])
            assert [len(v or b"") for v in got.values()] == [files.MAX_FILE] * per
            with pytest.raises(ValidationError, match="bytes read in one call") as bad:
                await m.read_files(env, SPELLINGS[: per + 1])
            assert bad.value.field == "paths" and str(files.MAX_TOTAL) in bad.value.problem
            # smaller files still add up: the bound counts bytes, not paths
            assert (await m.read_files(env, ["nothing", "big"]))["nothing"] is None
        finally:
            await m.close()

    asyncio.run(main())


def test_over_http_the_bound_is_a_4xx_and_the_answer_is_made_off_the_loop(tmp_path, monkeypatch):
    """A 256 MiB answer is read and base64/JSON-encoded in worker threads, never on the event
    loop's thread (each step records the thread it ran in), so other clients are served."""
    threads: dict[str, set[int]] = {"read": set(), "encode": set()}
    real_read, real_encode = files.read, env_routes._encoded

    def read(*a, **k):
        threads["read"].add(threading.get_ident())
        return real_read(*a, **k)

    def encode(*a, **k):
        threads["encode"].add(threading.get_ident())
        return real_encode(*a, **k)

    monkeypatch.setattr(files, "read", read)
    monkeypatch.setattr(env_routes, "_encoded", encode)

    async def main():
        loop_thread = threading.get_ident()
        tg = Tangram(cpu=CpuManager(AffinityBackend(), workdir_root=str(tmp_path)))
        async with tg:
            env = await tg.open_env("t", memory_mb=64)
            _big(tg.cpu.envs.get(env).workdir)
            transport = httpx.ASGITransport(app=create_app(tg))
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as h:
                url = f"/v1/envs/{env}/files/read"
                over = await h.post(url, json={"paths": SPELLINGS})
                assert over.status_code in (400, 413, 422), over.text
                assert "bytes read in one call" in over.text and "Traceback" not in over.text
                reading = asyncio.ensure_future(
                    h.post(url, json={"paths": SPELLINGS[:4]}, timeout=120)
                )
                assert (await h.get("/healthz")).status_code == 200
                r = await reading
                assert r.status_code == 200
                body = r.json()["files"]
                assert set(body) == set(SPELLINGS[:4])
                assert base64.b64decode(body["big"]) == bytes(files.MAX_FILE)
        assert threads["read"] and loop_thread not in threads["read"]
        assert threads["encode"] and loop_thread not in threads["encode"]

    asyncio.run(main())
