"""Issue 22, finding 6: 1,000 bwrap environments in one `tangram serve` under a 1,024
open-file limit (soft and hard, so raising the soft limit cannot help), the server restarts
cleanly after them, and running out of descriptors is a 503 naming the limit, never a 500 or
a hang."""

from __future__ import annotations

import concurrent.futures as cf
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from managers.cpu.backends.bwrap.backend import BwrapBackend

pytestmark = [pytest.mark.cgroup]
ENVS = 1_000


@pytest.fixture(scope="module")
def bwrap_or_skip() -> None:
    why = BwrapBackend.probe()
    if why is not None:
        pytest.skip(f"bwrap backend unavailable: {why}")
    if shutil.which("prlimit") is None:
        pytest.skip("prlimit (util-linux) not found")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(nofile: int, workdir: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`tangram serve` (the bwrap backend here) under RLIMIT_NOFILE nofile:nofile."""
    port = _free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [
            "prlimit",
            f"--nofile={nofile}:{nofile}",
            sys.executable,
            "-m",
            "tangram.runtime.cli",
            "serve",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=log,
        env={**os.environ, "TMPDIR": workdir},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.2)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(180)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.seek(0)
        proc.log = log.read().decode(errors="replace")  # type: ignore[attr-defined]
        log.close()


def _open(url: str, names: range) -> list[tuple[int, str]]:
    with httpx.Client(base_url=url, timeout=120) as c:
        return [
            (r.status_code, r.text)
            for r in (
                c.post("/v1/envs", json={"trajectory": f"t{i}", "memory_mb": 8}) for i in names
            )
        ]


def test_a_thousand_environments_under_1024_open_files(bwrap_or_skip, tmp_path):
    t0 = time.monotonic()
    with server(1024, str(tmp_path)) as (url, proc):
        chunks = [range(i, ENVS, 8) for i in range(8)]
        with cf.ThreadPoolExecutor(8) as ex:
            answers = [a for part in ex.map(lambda r: _open(url, r), chunks) for a in part]
        codes = sorted({code for code, _ in answers})
        with httpx.Client(base_url=url, timeout=120) as c:
            last = answers[-1][1]
            env_id = httpx.Response(200, content=last).json()["env_id"] if codes == [200] else None
            echo = (
                c.post(f"/v1/envs/{env_id}/exec", json={"command": "echo hi"}).json()
                if env_id
                else None
            )
            status = c.get("/v1/status").json()
        held = len(os.listdir(f"/proc/{proc.pid}/fd"))
    opened_s = time.monotonic() - t0
    print(
        f"\n{ENVS} environments opened under RLIMIT_NOFILE 1024:1024 in {opened_s:.1f} s "
        f"(loaded machine); the server held {held} descriptors with all of them open"
    )
    assert codes == [200], [t for c, t in answers if c != 200][:3]
    assert status["envs"] == ENVS
    assert echo is not None and echo["stdout"] == "hi\n"
    # a spawner (the fast path) holds one descriptor per environment until half the limit is
    # used; environments past that take the nsenter path, which holds none
    assert held < 1024 // 2 + 100
    # it shut down cleanly, and the next server starts on the same folder and sweeps nothing
    assert "Traceback" not in proc.log, proc.log[-3000:]
    with server(1024, str(tmp_path)) as (url2, proc2):
        assert httpx.get(f"{url2}/healthz", timeout=10).status_code == 200
    assert not [p for p in os.listdir(tmp_path) if p.startswith("tangram-")]


def test_out_of_descriptors_is_a_503_naming_the_limit(bwrap_or_skip, tmp_path):
    """A server with room for almost nothing: every answer is 200 or a 503 that names
    RLIMIT_NOFILE, never a 500, and the server still answers afterwards. (About 1 run in 3
    gave a bare 500 while the error handlers ran in a worker thread: anyio imported its thread
    backend then, which needs a descriptor; they run on the loop now, `errors._on_loop`.)"""
    with server(16, str(tmp_path)) as (url, proc):
        with cf.ThreadPoolExecutor(6) as ex:
            answers = [
                a for part in ex.map(lambda i: _open(url, range(i, i + 1)), range(6)) for a in part
            ]
        alive = httpx.get(f"{url}/healthz", timeout=10).status_code
    codes = {c for c, _ in answers}
    assert codes <= {200, 503}, [a for a in answers if a[0] not in (200, 503)]
    assert 503 in codes
    assert all("RLIMIT_NOFILE 16" in t for c, t in answers if c == 503)
    assert alive == 200
