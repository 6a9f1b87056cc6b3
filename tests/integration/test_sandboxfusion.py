"""`POST /run_code` (SandboxFusion's API) on a real `tangram serve` on loopback: commands run
for real (the `affinity` backend, no root needed); every request leaves no environment behind.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from managers.cpu import CpuManager
from managers.cpu.backends.affinity import AffinityBackend
from tangram.results import Result, Status
from tangram.runtime.facade import Tangram
from tangram.runtime.sandboxfusion import (
    ARG_CHUNK,
    DEFAULT_MEMORY_MB,
    RunCodeRequest,
    command_result,
    overall,
    staged,
)
from tangram.runtime.sandboxfusion.warm import warm_pool
from tangram.runtime.server import RedactTokens, create_app, serve_in_thread

pytestmark = pytest.mark.skipif(
    AffinityBackend.probe() is not None, reason=f"affinity backend: {AffinityBackend.probe()}"
)
TOKEN = "s3cret-token"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(32))  # bytes a PNG starts with, then anything


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def workdir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tangram-sf-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def server(workdir: str) -> Iterator[tuple[str, Tangram]]:
    tg = Tangram(cpu=CpuManager(AffinityBackend(), workdir_root=workdir))
    with serve_in_thread(create_app(tg, TOKEN)) as url:
        yield url, tg


@pytest.fixture
def client(server: tuple[str, Tangram], workdir: str) -> Iterator[httpx.Client]:
    """A client whose every request carries the token as SandboxFusion clients can: in the
    URL. After each test: no environment is open and no work directory is left but the warm
    pool's never-used ones."""
    url, tg = server
    with httpx.Client(base_url=url, params={"token": TOKEN}, timeout=60) as c:
        yield c
    pool = warm_pool(tg, DEFAULT_MEMORY_MB)
    for _ in range(200):  # the refill runs in the background: let it settle
        if pool is None or not pool.filling:
            break
        time.sleep(0.05)
    idle = pool.idle if pool is not None else 0
    assert tg.status().envs == idle and tg.status().running == 0
    assert len(os.listdir(workdir)) == idle


def run(client: httpx.Client, **body) -> dict:
    r = client.post("/run_code", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_python_stdin_to_stdout(client):
    d = run(
        client,
        code="import sys\nprint(sys.stdin.read().strip()[::-1])",
        language="python",
        stdin="tangram\n",
    )
    assert d["status"] == "Success" and d["message"] == "" and d["compile_result"] is None
    rr = d["run_result"]
    assert rr["status"] == "Finished" and rr["return_code"] == 0 and rr["stdout"] == "margnat\n"
    assert rr["execution_time"] > 0
    (step,) = d["tangram"]["steps"]  # the extension: the run's grant
    assert step["step"] == "run" and step["cores"] == 1 and len(step["placement"]["cores"]) == 1


def test_no_stdin_reads_eof(client):
    d = run(client, code="import sys; print(repr(sys.stdin.read()))", language="python")
    assert d["run_result"]["stdout"] == "''\n"


def test_files_in_and_fetched(client):
    d = run(
        client,
        language="bash",
        code="mkdir -p out && tr a-z A-Z < in/data.txt > out/up.txt && head -c 3 blob > b2",
        files={
            "in/data.txt": b64(b"hello\n"),
            "blob": b64(bytes(range(256)) * 400),
            "skipped": None,
        },
        fetch_files=["out/up.txt", "b2", "in/data.txt", "missing.txt"],
    )
    assert d["status"] == "Success", d
    assert base64.b64decode(d["files"]["out/up.txt"]) == b"HELLO\n"
    assert base64.b64decode(d["files"]["b2"]) == bytes([0, 1, 2])
    assert base64.b64decode(d["files"]["in/data.txt"]) == b"hello\n"
    assert "missing.txt" not in d["files"]  # as SandboxFusion: a missing file is left out


def test_nonzero_exit_is_failed(client):
    d = run(client, code="import sys; print('x'); sys.exit(3)", language="python")
    assert d["status"] == "Failed"
    assert d["run_result"]["return_code"] == 3 and d["run_result"]["stdout"] == "x\n"


def test_timeout_is_time_limit_exceeded(client):
    d = run(
        client,
        code="import time\nprint('started', flush=True)\ntime.sleep(30)",
        language="python",
        run_timeout=0.5,
    )
    assert d["status"] == "Failed"
    rr = d["run_result"]
    assert rr["status"] == "TimeLimitExceeded" and rr["return_code"] is None
    assert rr["stdout"] == "started\n"


def test_a_client_that_goes_away_cancels_its_run(client, server):
    """The client gives up on a 30 s run after 0.5 s: the run is killed at once (the fixture
    then finds no environment left but the pool's), and the next request is answered."""
    _, tg = server
    with pytest.raises(httpx.ReadTimeout):
        client.post(
            "/run_code",
            json={"code": "import time; time.sleep(30)", "language": "python", "run_timeout": 60},
            timeout=0.5,
        )
    deadline = time.monotonic() + 5
    while tg.status().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tg.status().running == 0
    assert run(client, code="print(2)", language="python")["run_result"]["stdout"] == "2\n"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_cpp_compiles_then_runs(client):
    ok = run(
        client,
        language="cpp",
        stdin="20 22",
        code='#include <cstdio>\nint main(){int a,b;scanf("%d %d",&a,&b);printf("%d\\n",a+b);}',
    )
    assert ok["status"] == "Success", ok
    assert ok["compile_result"]["return_code"] == 0 and ok["run_result"]["stdout"] == "42\n"
    assert [s["step"] for s in ok["tangram"]["steps"]] == ["compile", "run"]
    bad = run(client, language="cpp", code="int main() { return }")
    assert bad["status"] == "Failed" and bad["run_result"] is None
    assert bad["compile_result"]["return_code"] != 0 and "error" in bad["compile_result"]["stderr"]


def test_pytest_runs_the_test_file_with_its_grant(client):
    code = (
        "import os\n"
        "def test_cores():\n"
        "    assert len(os.sched_getaffinity(0)) >= 1\n"
        "def test_fails():\n"
        "    assert 1 == 2\n"
    )
    d = run(client, language="pytest", code=code, args=["-k", "cores"])
    assert d["status"] == "Success", d["run_result"]
    assert "1 passed" in d["run_result"]["stdout"]
    d = run(client, language="pytest", code=code, cpu={"min": 1, "max": os.cpu_count() or 1})
    assert d["status"] == "Failed" and "1 failed" in d["run_result"]["stdout"]
    assert 1 <= d["tangram"]["steps"][0]["cores"] <= (os.cpu_count() or 1)


def test_an_elastic_pytest_run_gets_its_workers_from_the_grant_plugin(client):
    """/run_code keeps no worker rule of its own: an elastic run loads the grant's plugin."""
    code = (
        "def test_plugin(request):\n"
        "    assert request.config.pluginmanager.has_plugin('tangram_pytest_grant')\n"
    )
    d = run(client, language="pytest", code=code, cpu={"min": 1, "max": 2})
    assert d["status"] == "Success", d["run_result"]
    d = run(client, language="pytest", code=code)  # not elastic: no plugin
    assert d["status"] == "Failed" and "1 failed" in d["run_result"]["stdout"], d["run_result"]


def test_known_language_without_a_runner_is_a_sandbox_error(client):
    d = run(client, language="lean", code="theorem x : 1 = 1 := rfl")
    assert d["status"] == "SandboxError" and "lean" in d["message"]
    assert d["run_result"] is None


def test_multi_turn_in_a_named_environment(client):
    bearer = {"authorization": f"Bearer {TOKEN}"}  # query tokens count on /run_code only
    env = client.post(
        "/v1/envs", json={"trajectory": "sf-multi", "memory_mb": 64}, headers=bearer
    ).json()
    env_id = env["env_id"]
    try:
        run(client, language="python", code="open('state', 'w').write('41')", env_id=env_id)
        d = run(
            client, language="python", code="print(int(open('state').read()) + 1)", env_id=env_id
        )
        assert d["run_result"]["stdout"] == "42\n" and d["tangram"]["env_id"] == env_id
    finally:
        assert client.delete(f"/v1/envs/{env_id}", headers=bearer).status_code == 200
    r = client.post("/run_code", json={"code": "1", "language": "python", "env_id": env_id})
    assert r.status_code == 404 and r.json()["field"] == "env_id"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"language": "python"}, "code"),
        ({"code": "print(1)"}, "language"),
        ({"code": "print(1)", "language": "klingon"}, "language"),
        ({"code": "1", "language": "python", "run_timeout": -1}, "run_timeout"),
        ({"code": "1", "language": "python", "compile_timeout": 0}, "compile_timeout"),
        ({"code": "1", "language": "python", "memory_limit_MB": 0}, "memory_limit_MB"),
        ({"code": "1", "language": "python", "files": {"a.txt": "not base64!"}}, "files"),
        ({"code": "1", "language": "python", "files": {"../x": "aGk="}}, "files"),
        ({"code": "1", "language": "python", "files": {"/etc/x": "aGk="}}, "files"),
        ({"code": "1", "language": "python", "files": {"a/../../x": "aGk="}}, "files"),
        ({"code": "1", "language": "python", "fetch_files": ["../../etc/passwd"]}, "fetch_files"),
        ({"code": "1", "language": "python", "fetch_files": ["/etc/passwd"]}, "fetch_files"),
        ({"code": "1", "language": "python", "cpu": 0}, "cpu"),
        ({"code": "1", "language": "python", "cpu": {"min": 2, "max": 1}}, "cpu"),
        ({"code": "1", "language": "python", "cpu": 1 << 19}, "cpu"),
    ],
)
def test_bad_requests_are_4xx_json(client, body, field):
    r = client.post("/run_code", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["field"].split(".")[0] == field


@pytest.mark.parametrize(
    "body, field",
    [  # found by the schema fuzzer: a 500 before
        ({"cells": ["1"], "files": {"a.txt": "x"}}, "files"),
        ({"cells": ["1"], "files": {"../x": "aGk="}}, "files"),
        ({"cells": ["1"], "fetch_files": ["../../etc/passwd"]}, "fetch_files"),
    ],
)
def test_bad_jupyter_files_are_4xx_json(client, body, field):
    r = client.post("/run_jupyter", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["field"].split(".")[0] == field


def test_token_in_the_url_or_the_header(server):
    url, _ = server
    body = {"code": "print(1)", "language": "python"}
    assert httpx.post(f"{url}/run_code", json=body).status_code == 401
    assert httpx.post(f"{url}/run_code?token=wrong", json=body).status_code == 401
    ok = httpx.post(f"{url}/run_code", json=body, headers={"authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200 and ok.json()["status"] == "Success"


def test_token_is_redacted_from_the_access_log(server):
    """uvicorn's own access log line, emitted by the real server, never holds the token."""
    url, _ = server
    access = logging.getLogger("uvicorn.access")
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler, level = Keep(), access.level
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        httpx.post(
            f"{url}/run_code?a=1&token={TOKEN}&b=2", json={"code": "print(1)", "language": "python"}
        )
        httpx.get(f"{url}/v1/status?token={TOKEN}")
    finally:
        access.removeHandler(handler)
        access.setLevel(level)
    assert any("/run_code?a=1&token=***&b=2" in line for line in lines), lines
    assert any("/v1/status?token=***" in line for line in lines), lines
    assert not any(TOKEN in line for line in lines)
    assert any(isinstance(f, RedactTokens) for f in access.filters)


def test_status_follows_sandboxfusions_rule():
    """Error beats a timeout beats a non-zero exit beats success, across the steps."""
    ok = command_result(Result(Status.OK, 0))
    bad = command_result(Result(Status.ERROR, 1))
    tle = command_result(Result(Status.TIMEOUT))
    err = command_result(Result(Status.FAILED, detail="node lost"))
    assert overall(ok, ok)[0] == "Success" and overall(None, ok)[0] == "Success"
    assert overall(ok, bad)[0] == "Failed" and overall(tle, None)[0] == "Failed"
    assert overall(bad, err) == ("SandboxError", "failed: node lost")
    assert RunCodeRequest(code="x", language="pytest", cpu=[1, 2]).is_elastic()
    assert not RunCodeRequest(code="x", language="python", cpu=[1, 2]).is_elastic()


def test_run_jupyter_cells_in_order_with_outputs_errors_and_images(client):
    cells = [
        "a = 123",
        "a",
        "print(a)",
        "import sys; sys.stderr.write('err')",
        "raise RuntimeError('boom')",
        f"from IPython.display import Image, display\ndisplay(Image(data={PNG!r}, format='png'))",
    ]
    r = client.post("/run_jupyter", json={"cells": cells})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["status"] == "Success" and d["driver"]["status"] == "Finished", d
    out = d["cells"]
    assert len(out) == len(cells)
    assert out[1]["display"] == [{"text/plain": "123"}] and out[2]["stdout"] == "123\n"
    assert out[3]["stderr"] == "err"
    assert out[4]["error"][0]["ename"] == "RuntimeError" and out[4]["error"][0]["evalue"] == "boom"
    assert base64.b64decode(out[5]["display"][0]["image/png"]) == PNG


def test_run_jupyter_cell_timeout_fails_and_keeps_the_cells_done(client):
    r = client.post(
        "/run_jupyter",
        json={
            "cells": ["x = 1", "import time; time.sleep(30)", "x"],
            "cell_timeout": 1.0,
            "fetch_files": ["made.txt"],
        },
    )
    d = r.json()
    assert d["status"] == "Failed" and d["driver"]["status"] == "TimeLimitExceeded", d
    assert len(d["cells"]) == 2 and d["files"] == {}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"cells": "print(1)"}, "cells"),
        ({"cells": [], "total_timeout": 0}, "total_timeout"),
        ({"cells": [], "kernel": "julia"}, "kernel"),
        ({"cells": [], "files": {"../x": "aGk="}}, "files"),
    ],
)
def test_run_jupyter_bad_requests_are_4xx_json(client, body, field):
    r = client.post("/run_jupyter", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["field"].split(".")[0] == field


def test_sandboxfusion_endpoints_not_served_say_so(client):
    for path in ("/submit", "/get_prompts", "/get_prompt_by_id"):
        r = client.post(path, json={})
        assert r.status_code == 404 and "not served" in r.json()["error"], r.text


names = st.text(st.characters(min_codepoint=97, max_codepoint=122), min_size=1, max_size=6)


@settings(max_examples=25, deadline=None)
@given(
    files=st.dictionaries(
        st.lists(names, min_size=1, max_size=3).map("/".join),
        st.binary(max_size=300) | st.just(b"\0" * (ARG_CHUNK + 7)),
        max_size=4,
    ),
    stdin=st.binary(max_size=50),
)
def test_staged_files_arrive_byte_for_byte(files, stdin):
    """Whatever `files` hold (empty, binary, more than one argv chunk, nested folders), the
    staging shell writes them exactly, then runs the command in the same shell."""
    # a file and a folder of the same name cannot both exist: keep the first
    kept: dict[str, bytes] = {}
    for path, data in files.items():
        parts = path.split("/")
        prefixes = {"/".join(parts[:i]) for i in range(1, len(parts))}
        if not any(p in kept for p in prefixes) and not any(k.startswith(path + "/") for k in kept):
            kept[path] = data
    kept[".in"] = stdin
    with tempfile.TemporaryDirectory() as d:
        done = subprocess.run(staged(kept, "exec cat .in"), cwd=d, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == stdin
        for path, data in kept.items():
            with open(os.path.join(d, path), "rb") as f:
                assert f.read() == data, path


def test_warm_sandboxes_give_way_to_a_request_that_needs_their_memory(tmp_path):
    """On a node of 3,000 MiB the pool holds two warm 1,024 MiB sandboxes; a request for
    2,500 MiB still runs (warm ones are closed for it), and the pool refills afterwards."""
    tg = Tangram(
        cpu=CpuManager(AffinityBackend(), workdir_root=str(tmp_path), memory_mb={"local": 3000})
    )
    with serve_in_thread(create_app(tg)) as url:
        body = {"code": "print(1)", "language": "python"}
        assert httpx.post(f"{url}/run_code", json=body, timeout=60).json()["status"] == "Success"
        pool = warm_pool(tg, DEFAULT_MEMORY_MB)
        for _ in range(200):
            if pool is not None and not pool.filling:
                break
            time.sleep(0.05)
        assert pool is not None and pool.idle == 2
        big = httpx.post(f"{url}/run_code", json={**body, "memory_limit_MB": 2500}, timeout=60)
        assert big.status_code == 200 and big.json()["status"] == "Success", big.text


def test_a_request_waits_for_memory_the_pool_is_letting_go_of(tmp_path, monkeypatch):
    """On a node of 2,100 MiB (two 1,024 MiB sandboxes) with one warm sandbox: while two
    requests hold the memory, a third that arrives as one of them is being closed waits for it
    (or for the refill's warm sandbox) instead of failing."""
    monkeypatch.setenv("TANGRAM_SANDBOXFUSION_WARM", "1")
    tg = Tangram(
        cpu=CpuManager(AffinityBackend(), workdir_root=str(tmp_path), memory_mb={"local": 2100})
    )

    async def scenario() -> tuple[str, int]:
        await tg.start()
        try:
            pool = warm_pool(tg, DEFAULT_MEMORY_MB)
            assert pool is not None
            a, b = await pool.take(DEFAULT_MEMORY_MB), await pool.take(DEFAULT_MEMORY_MB)
            pool.release(a)  # closed in the background, then the pool refills
            c = await pool.take(DEFAULT_MEMORY_MB)  # no memory free now: waits, no raise
            pool.release(b)
            pool.release(c)
            # the closes and the refill run in the background: wait (bounded) until they are
            # done and one environment is left, or report what is left then
            for _ in range(3000):
                if not pool.filling and tg.status().envs == 1:
                    break
                await asyncio.sleep(0.01)
            return c, tg.status().envs
        finally:
            await tg.shutdown()

    c, left = asyncio.run(scenario())
    assert c and left == 1  # only the refilled warm one was left
