"""SWE-ReX's own client (`swerex.runtime.remote.RemoteRuntime`, the real package from PyPI)
against `tangram serve` over HTTP, one environment per runtime at `/swerex/{env_id}`: sessions
that keep their state, timeouts that interrupt and leave the session usable, background jobs
that survive, interactive programs, the exceptions its client raises again, files, and many
sessions at once. Needs root and the bwrap backend (its sandboxes host the sessions)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx
import pytest

from managers.cpu.backends.bwrap.backend import BwrapBackend
from tangram.runtime.client import TangramClient

swerex = pytest.importorskip("swerex.runtime.remote", reason="swe-rex is not installed")
from swerex.exceptions import (
    CommandTimeoutError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    BashAction,
    CloseBashSessionRequest,
    Command,
    CreateBashSessionRequest,
    ReadFileRequest,
    UploadRequest,
    WriteFileRequest,
)

TOKEN = "swerex-test-token"


@pytest.fixture(scope="module")
def served() -> Iterator[str]:
    why = BwrapBackend.probe()
    if why is not None:
        pytest.skip(f"bwrap backend unavailable: {why}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state = tempfile.mkdtemp(prefix="swerex-test-")
    config = os.path.join(state, "tangram.yaml")
    with open(config, "w") as f:
        f.write("cpu: {backend: bwrap}\n")
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tangram.runtime.cli", "serve", "--config", config,
         "--port", str(port), "--token", TOKEN, "--log-level", "warning"],
        stdout=log, stderr=log, env={**os.environ, "TMPDIR": state},
    )  # fmt: skip
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
        yield url
    finally:
        proc.terminate()
        proc.wait(60)
        log.seek(0)
        text = log.read().decode(errors="replace")
        log.close()
        assert "Traceback" not in text, text[-3000:]


def _env(url: str, trajectory: str) -> str:
    r = httpx.post(
        f"{url}/v1/envs",
        json={"trajectory": trajectory, "memory_mb": 256},
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()["env_id"]


def _runtime(url: str, env: str, token: str = TOKEN):
    return swerex.RemoteRuntime(host=f"{url}/swerex/{env}", port=None, auth_token=token)


def run(coro):
    return asyncio.run(coro)


def test_a_session_keeps_its_state_and_its_background_jobs(served):
    rt = _runtime(served, _env(served, "state"))

    async def go():
        assert (await rt.is_alive()).is_alive
        await rt.create_session(CreateBashSessionRequest(session="default"))
        await rt.run_in_session(BashAction(command="cd /tmp && export X=41 && f() { echo $1; }"))
        obs = await rt.run_in_session(BashAction(command="pwd; echo $((X + 1)); f hi"))
        assert obs.output.split() == ["/tmp", "42", "hi"] and obs.exit_code == 0
        await rt.run_in_session(BashAction(command="sleep 300 &"))
        jobs = await rt.run_in_session(BashAction(command="jobs | wc -l"))
        assert jobs.output.strip() == "1"
        with pytest.raises(SessionExistsError):
            await rt.create_session(CreateBashSessionRequest(session="default"))
        with pytest.raises(SessionDoesNotExistError):
            await rt.run_in_session(BashAction(command="true", session="nope"))
        await rt.close_session(CloseBashSessionRequest(session="default"))
        with pytest.raises(SessionDoesNotExistError):
            await rt.run_in_session(BashAction(command="true"))

    run(go())


def test_a_timeout_interrupts_and_the_session_answers_the_next_command(served):
    rt = _runtime(served, _env(served, "timeout"))

    async def go():
        await rt.create_session(CreateBashSessionRequest())
        t0 = time.monotonic()
        with pytest.raises(CommandTimeoutError):
            await rt.run_in_session(BashAction(command="sleep 60", timeout=1))
        assert time.monotonic() - t0 < 15
        with pytest.raises(CommandTimeoutError):  # a loop in the shell itself
            await rt.run_in_session(BashAction(command="while :; do :; done", timeout=1))
        obs = await rt.run_in_session(BashAction(command="echo still here"))
        assert obs.output.strip() == "still here"

    run(go())


def test_exit_codes_and_checks(served):
    rt = _runtime(served, _env(served, "checks"))

    async def go():
        await rt.create_session(CreateBashSessionRequest())
        with pytest.raises(NonZeroExitCodeError, match="exit code 3"):
            await rt.run_in_session(BashAction(command="(exit 3)"))
        obs = await rt.run_in_session(BashAction(command="(exit 3)", check="silent"))
        assert obs.exit_code == 3
        obs = await rt.run_in_session(BashAction(command="false", check="ignore"))
        assert obs.exit_code is None

    run(go())


def test_an_interactive_program_answers_at_its_prompt(served):
    rt = _runtime(served, _env(served, "interactive"))

    async def go():
        await rt.create_session(CreateBashSessionRequest())
        await rt.run_in_session(
            BashAction(command="python3", is_interactive_command=True, expect=[">>> "])
        )
        await rt.run_in_session(
            BashAction(command="x = 6 * 7", is_interactive_command=True, expect=[">>> "])
        )
        obs = await rt.run_in_session(
            BashAction(command="print(x)", is_interactive_command=True, expect=[">>> "])
        )
        assert obs.output.strip() == "42" and obs.expect_string == ">>> "
        await rt.run_in_session(BashAction(command="exit()", is_interactive_quit=True))
        obs = await rt.run_in_session(BashAction(command="echo shell"))
        assert obs.output.strip() == "shell"

    run(go())


def test_execute_and_files(served, tmp_path):
    rt = _runtime(served, _env(served, "files"))
    (tmp_path / "one.txt").write_text("uploaded\n")
    folder = tmp_path / "tree"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "deep.txt").write_text("deep\n")

    async def go():
        out = await rt.execute(Command(command="echo $((2 + 3)); echo err >&2", shell=True))
        assert (out.stdout, out.stderr, out.exit_code) == ("5\n", "err\n", 0)
        out = await rt.execute(Command(command=["ls", "/sandbox"]))
        assert out.exit_code == 0
        with pytest.raises(NonZeroExitCodeError):
            await rt.execute(Command(command="exit 2", shell=True, check=True))
        await rt.write_file(WriteFileRequest(content="hello\n", path="/sandbox/a/b.txt"))
        assert (await rt.read_file(ReadFileRequest(path="/sandbox/a/b.txt"))).content == "hello\n"
        await rt.upload(
            UploadRequest(source_path=str(tmp_path / "one.txt"), target_path="/sandbox/one.txt")
        )
        await rt.upload(UploadRequest(source_path=str(folder), target_path="/sandbox/tree"))
        got = await rt.execute(
            Command(command="cat /sandbox/one.txt /sandbox/tree/sub/deep.txt", shell=True)
        )
        assert got.stdout == "uploaded\ndeep\n"
        with pytest.raises(FileNotFoundError):
            await rt.read_file(ReadFileRequest(path="/sandbox/missing"))

    run(go())


def test_a_wrong_key_is_refused(served):
    env = _env(served, "key")
    r = httpx.get(f"{served}/swerex/{env}/is_alive", headers={"X-API-Key": "wrong"})
    assert r.status_code == 401
    r = httpx.get(f"{served}/swerex/{env}/is_alive", headers={"X-API-Key": TOKEN})
    assert r.status_code == 200 and r.json()["is_alive"] is True
    r = httpx.get(f"{served}/swerex/env-nope/is_alive", headers={"X-API-Key": TOKEN})
    assert r.json()["is_alive"] is False


def test_many_sessions_at_once(served):
    envs = [_env(served, f"many-{i}") for i in range(12)]

    async def one(env: str) -> list[str]:
        rt = _runtime(served, env)
        await rt.create_session(CreateBashSessionRequest())
        await rt.run_in_session(BashAction(command=f"export ME={env}"))
        outs = [(await rt.run_in_session(BashAction(command="echo $ME"))).output.strip()]
        await rt.close()
        return outs

    async def go():
        return await asyncio.gather(*(one(e) for e in envs))

    assert run(go()) == [[e] for e in envs]


def _client(url: str) -> TangramClient:
    return TangramClient(url, token=TOKEN)


def test_the_native_session_and_kernel_api_over_http(served):
    async def go():
        async with _client(served) as c:
            env = await c.open_env("native", 1024)
            assert await c.open_session(env, "sh") == "sh"
            await c.run(env, "sh", "cd /tmp; export N=3")
            r = await c.run(env, "sh", "echo $N $(pwd)", cpu=1)
            timed = await c.run(env, "sh", "sleep 30", timeout=0.5)
            after = await c.run(env, "sh", "echo ok")
            listed = await c.sessions(env)
            k = await c.open_kernel(env)
            a = await c.run_cell(k, "v = [1, 2, 3]\nprint(sum(v))")
            b = await c.run_cell(k, "import time\nwhile True: time.sleep(0.05)", timeout=1)
            d = await c.run_cell(k, "len(v)")
            e = await c.run_cell(k, "raise ValueError('boom')")
            await c.close_kernel(k)
            await c.close_session(env, "sh")
            return r, timed, after, listed, a, b, d, e, await c.sessions(env)

    r, timed, after, listed, a, b, d, e, left = run(go())
    assert r.status == "ok" and r.stdout == "3 /tmp\n" and r.units == {"cpu": 1}
    assert timed.status == "timeout" and after.stdout == "ok\n"
    assert listed == ["sh"] and left == []
    assert a.status == "ok" and a.stdout == "6\n"
    assert b.status == "timeout" and b.error and b.error[0]["ename"] == "KeyboardInterrupt"
    assert d.status == "ok" and d.display == [{"text/plain": "3"}]
    assert e.status == "ok" and e.error[0]["ename"] == "ValueError"


def test_bad_session_input_is_a_clear_4xx_or_a_result_naming_it(served):
    env = _env(served, "bad-input")
    h = {"authorization": f"Bearer {TOKEN}"}
    base = f"{served}/v1/envs/{env}/sessions"
    assert httpx.post(base, json={"name": "s"}, headers=h).status_code == 200
    again = httpx.post(base, json={"name": "s"}, headers=h)
    assert again.status_code == 422 and "already open" in again.text
    bad = httpx.post(base, json={"name": "../x"}, headers=h)
    assert bad.status_code == 422 and "Traceback" not in bad.text
    unknown = httpx.post(f"{base}/nope/run", json={"command": "true"}, headers=h)
    assert unknown.status_code == 422 and "no open session" in unknown.text
    nul = httpx.post(f"{base}/s/run", json={"command": "echo \u0000"}, headers=h)
    assert nul.status_code == 422
    lone = httpx.post(
        f"{base}/s/run",
        content=b'{"command": "echo \\ud800"}',
        headers={**h, "content-type": "application/json"},
    )
    assert lone.status_code in (200, 422) and "Traceback" not in lone.text
    if lone.status_code == 200:
        assert lone.json()["status"] in ("ok", "failed", "error")
    flood = httpx.post(
        f"{base}/s/run",
        json={"command": "yes | head -c 5000000", "output_cap": 1000},
        headers=h,
        timeout=60,
    )
    assert flood.status_code == 200 and flood.json()["truncated"] is True
    assert len(flood.json()["stdout"]) <= 1000
    long_line = httpx.post(
        f"{base}/s/run", json={"command": "x" * 5000, "interactive": True}, headers=h
    )
    assert long_line.status_code == 422 and "at most 4000 characters a line" in long_line.text
    ok = httpx.post(f"{base}/s/run", json={"command": "echo fine"}, headers=h, timeout=60)
    assert ok.json()["stdout"] == "fine\n"


def test_run_jupyter_with_a_session_keeps_its_kernel_across_requests(served):
    """Our `/run_jupyter` extension: `session` keeps the kernel between requests; without it,
    SandboxFusion's semantics (a kernel of the request's own: the variable is gone)."""
    h = {"authorization": f"Bearer {TOKEN}"}

    def call(body):
        r = httpx.post(f"{served}/run_jupyter", json=body, headers=h, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    first = call({"cells": ["z = 20", "z + 1"], "session": "nb"})
    again = call({"cells": ["print(z * 2)"], "session": "nb"})
    stop = call({"cells": ["import time\nwhile True: time.sleep(0.05)"], "session": "nb",
                 "cell_timeout": 1})  # fmt: skip
    after = call({"cells": ["z"], "session": "nb"})
    fresh = call({"cells": ["z"]})
    assert first["status"] == "Success" and first["cells"][1]["display"] == [{"text/plain": "21"}]
    assert again["cells"][0]["stdout"] == "40\n"
    assert stop["status"] == "Failed" and stop["driver"]["status"] == "TimeLimitExceeded"
    assert after["status"] == "Success" and after["cells"][0]["display"] == [{"text/plain": "20"}]
    assert fresh["cells"][0]["error"][0]["ename"] == "NameError"
