"""The SandboxFusion SDK (`sandbox-fusion` from PyPI, unmodified) against a real `tangram serve`
with a token: every SDK function is exercised. The SDK sends no auth header and appends the
function's path to its endpoint, so the token rides in the endpoint's query:
`http://host:port/?token=T&_=` (the path lands in `_`, which the server dispatches on)."""

from __future__ import annotations

import asyncio
import base64
import tempfile
from collections.abc import Iterator

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.affinity import AffinityBackend
from tangram.runtime.facade import Tangram
from tangram.runtime.server import create_app, serve_in_thread

sf = pytest.importorskip("sandbox_fusion", reason="the sandbox-fusion SDK is not installed")
pytestmark = pytest.mark.skipif(
    AffinityBackend.probe() is not None, reason=f"affinity backend: {AffinityBackend.probe()}"
)
TOKEN = "sdk-token"


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    root = tempfile.mkdtemp(prefix="tangram-sf-sdk-")
    tg = Tangram(cpu=CpuManager(AffinityBackend(), workdir_root=root))
    with serve_in_thread(create_app(tg, TOKEN)) as url:
        yield f"{url}/?token={TOKEN}&_="


def test_run_code_sync_and_async_with_the_token_in_the_endpoint(endpoint):
    req = sf.RunCodeRequest(
        code="print(input()[::-1])",
        language="python",
        stdin="abc",
        files={"x.txt": base64.b64encode(b"x").decode()},
    )
    resp = sf.run_code(req, endpoint=endpoint, max_attempts=1)
    assert resp.status == sf.RunStatus.Success and resp.run_result.stdout == "cba\n"
    resp = asyncio.run(sf.run_code_async(req, endpoint=endpoint, max_attempts=1))
    assert resp.status == sf.RunStatus.Success and resp.run_result.stdout == "cba\n"
    assert sf.summary_run_code_result(resp, sf.SummaryMapping()) == sf.RunStatus.Success


def test_summary_and_concurrency_helpers(endpoint):
    sf.set_endpoint(endpoint)
    try:
        reqs = [
            sf.RunCodeRequest(code=f"import sys; sys.exit({k})", language="python") for k in (0, 3)
        ]
        results = sf.run_concurrent(sf.run_code, args=[[r] for r in reqs], concurrency=2)
    finally:
        sf.set_endpoint("")
    mapping = sf.SummaryMapping(RunFailed="run failed")
    assert [sf.summary_run_code_result(r, mapping) for r in results] == ["Success", "run failed"]
    bad = sf.run_code(
        sf.RunCodeRequest(code="int main() { x }", language="cpp"),
        endpoint=endpoint,
        max_attempts=1,
    )
    assert sf.summary_run_code_result(bad, sf.SummaryMapping(CompileFailed="ce")) == "ce"


def test_run_jupyter_sync_and_async(endpoint):
    req = sf.RunJupyterRequest(cells=["a = 6 * 7", "a", "print(a)"])
    resp = sf.run_jupyter(req, endpoint=endpoint, max_attempts=1)
    assert resp.status == sf.RunStatus.Success
    assert resp.cells[1].display == [{"text/plain": "42"}] and resp.cells[2].stdout == "42\n"
    resp = asyncio.run(sf.run_jupyter_async(req, endpoint=endpoint, max_attempts=1))
    assert resp.status == sf.RunStatus.Success and resp.cells[2].stdout == "42\n"


def test_functions_not_served_fail_saying_so(endpoint):
    prompts = sf.GetPromptsRequest(dataset="humaneval", config=sf.TestConfig())
    with pytest.raises(Exception, match="not served"):
        sf.get_prompts(prompts, endpoint=endpoint)
    with pytest.raises(Exception, match="not served"):
        sf.get_prompt_by_id(
            sf.GetPromptByIdRequest(dataset="humaneval", id=0, config=sf.TestConfig()),
            endpoint=endpoint,
        )
    submit = sf.SubmitRequest(dataset="humaneval", id=0, completion="x", config=sf.TestConfig())
    with pytest.raises(Exception, match="not served"):
        sf.submit(submit, endpoint=endpoint, max_attempts=1)
    with pytest.raises(Exception, match="not served"):
        asyncio.run(sf.get_prompts_async(prompts, endpoint=endpoint))
    assert sf.submit_safe(submit, endpoint=endpoint, max_attempts=1).accepted is False


def test_a_wrong_token_is_refused(endpoint):
    wrong = endpoint.replace(TOKEN, "nope")
    with pytest.raises(Exception, match="401"):
        sf.run_code(
            sf.RunCodeRequest(code="print(1)", language="python"), endpoint=wrong, max_attempts=1
        )
