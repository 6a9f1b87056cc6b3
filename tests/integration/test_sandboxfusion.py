"""`POST /run_code` (SandboxFusion's API) on a real `tangram serve` on loopback: commands run
for real (the `affinity` backend, no root needed); every request leaves no environment behind.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import httpx
import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.affinity import AffinityBackend
from tangram.results import Result, Status
from tangram.runtime.facade import Tangram
from tangram.runtime.sandboxfusion import RunCodeRequest, command_result, overall
from tangram.runtime.server import RedactTokens, create_app, serve_in_thread

pytestmark = pytest.mark.skipif(AffinityBackend.probe() is not None,
                                reason=f"affinity backend: {AffinityBackend.probe()}")
TOKEN = "s3cret-token"


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
    URL. After each test: no environment is open and no work directory is left."""
    url, tg = server
    with httpx.Client(base_url=url, params={"token": TOKEN}, timeout=60) as c:
        yield c
    assert tg.status()["envs"] == 0 and tg.status()["running"] == 0
    assert os.listdir(workdir) == []


def run(client: httpx.Client, **body) -> dict:
    r = client.post("/run_code", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_python_stdin_to_stdout(client):
    d = run(client, code="import sys\nprint(sys.stdin.read().strip()[::-1])", language="python",
            stdin="tangram\n")
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
    d = run(client, language="bash",
            code="mkdir -p out && tr a-z A-Z < in/data.txt > out/up.txt && head -c 3 blob > b2",
            files={"in/data.txt": b64(b"hello\n"), "blob": b64(bytes(range(256)) * 400),
                   "skipped": None},
            fetch_files=["out/up.txt", "b2", "in/data.txt", "missing.txt"])
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
    d = run(client, code="import time\nprint('started', flush=True)\ntime.sleep(30)",
            language="python", run_timeout=0.5)
    assert d["status"] == "Failed"
    rr = d["run_result"]
    assert rr["status"] == "TimeLimitExceeded" and rr["return_code"] is None
    assert rr["stdout"] == "started\n"


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ on this machine")
def test_cpp_compiles_then_runs(client):
    ok = run(client, language="cpp", stdin="20 22",
             code="#include <cstdio>\nint main(){int a,b;scanf(\"%d %d\",&a,&b);"
                  "printf(\"%d\\n\",a+b);}")
    assert ok["status"] == "Success", ok
    assert ok["compile_result"]["return_code"] == 0 and ok["run_result"]["stdout"] == "42\n"
    assert [s["step"] for s in ok["tangram"]["steps"]] == ["compile", "run"]
    bad = run(client, language="cpp", code="int main() { return }")
    assert bad["status"] == "Failed" and bad["run_result"] is None
    assert bad["compile_result"]["return_code"] != 0 and "error" in bad["compile_result"]["stderr"]


def test_pytest_runs_the_test_file_with_its_grant(client):
    code = ("import os\n"
            "def test_cores():\n"
            "    assert len(os.sched_getaffinity(0)) >= 1\n"
            "def test_fails():\n"
            "    assert 1 == 2\n")
    d = run(client, language="pytest", code=code, args=["-k", "cores"])
    assert d["status"] == "Success", d["run_result"]
    assert "1 passed" in d["run_result"]["stdout"]
    d = run(client, language="pytest", code=code, cpu={"min": 1, "max": os.cpu_count() or 1})
    assert d["status"] == "Failed" and "1 failed" in d["run_result"]["stdout"]
    assert 1 <= d["tangram"]["steps"][0]["cores"] <= (os.cpu_count() or 1)


def test_known_language_without_a_runner_is_a_sandbox_error(client):
    d = run(client, language="lean", code="theorem x : 1 = 1 := rfl")
    assert d["status"] == "SandboxError" and "lean" in d["message"]
    assert d["run_result"] is None


def test_multi_turn_in_a_named_environment(client):
    bearer = {"authorization": f"Bearer {TOKEN}"}  # query tokens count on /run_code only
    env = client.post("/v1/envs", json={"trajectory": "sf-multi", "memory_mb": 64},
                      headers=bearer).json()
    env_id = env["env_id"]
    try:
        run(client, language="python", code="open('state', 'w').write('41')", env_id=env_id)
        d = run(client, language="python", code="print(int(open('state').read()) + 1)",
                env_id=env_id)
        assert d["run_result"]["stdout"] == "42\n" and d["tangram"]["env_id"] == env_id
    finally:
        assert client.delete(f"/v1/envs/{env_id}", headers=bearer).status_code == 200
    r = client.post("/run_code", json={"code": "1", "language": "python", "env_id": env_id})
    assert r.status_code == 404 and r.json()["field"] == "env_id"


@pytest.mark.parametrize("body, field", [
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
])
def test_bad_requests_are_4xx_json(client, body, field):
    r = client.post("/run_code", json=body)
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
        httpx.post(f"{url}/run_code?a=1&token={TOKEN}&b=2",
                   json={"code": "print(1)", "language": "python"})
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
